#!/usr/bin/env bash
# Models in and out through the CLI (issue 31): Hugging Face export and import, `kiln generate`,
# `kiln eval`. One check per invocation:
#   hf_models.sh CHECK KILN SOURCE_DIR WORK_DIR MPIEXEC HF_LOSS_DUMP
# CHECK:
#   torch     against an independent PyTorch GPT-2 written from Hugging Face's modelling code
#             (tests/python/hf_gpt2.py, not Kiln's): a GPT-2 made by PyTorch as an HF directory,
#             imported, gives Kiln's logits (`kiln generate --logits`) within fp32 round-off of
#             PyTorch's and Kiln's first training-step loss (hf_loss_dump: the trainer's
#             init_from path and training forward) within 1e-5 of PyTorch's; a Kiln checkpoint
#             exported is read by the PyTorch code with the same logits as Kiln's from the
#             checkpoint, greedy `kiln generate` equals PyTorch's greedy tokens (full forward
#             argmax each step) and is the same with --no-cache, from the checkpoint and from the
#             export, run after run; the export's tensors are the consolidated file's exactly
#             (transposed where GPT-2's Conv1D stores [in, out]); export -> import -> export is
#             byte-identical; bad directories are refused naming the file and the field.
#   mpi       a DP=2 x TP=2 ZeRO-3 checkpoint (4 ranks under mpirun) exports byte for byte what
#             its consolidated file exports, and a DP=2 x TP=2 ZeRO-3 run started from that
#             export (model.init_from=DIR, each rank reading its slices) has the losses of one
#             started from the consolidated file, bit for bit.
#   e2e       on `kiln prep` data of the default corpus (with a validation split): train, export
#             (tokenizer files included), `kiln generate --prompt TEXT` from the run and from the
#             export give the same text; `kiln eval --data` (validation split per domain),
#             `--jsonl` and `--tasks` (multiple choice) give finite losses, bits per byte and
#             accuracies in [0, 1] with the arithmetic they claim; the training loop's eval.tasks
#             writes the same task accuracy into metrics.jsonl as `kiln eval` of the same step;
#             bad task lines name the line and field.
#   torch_llama  the same against an independent PyTorch Llama (tests/python/hf_llama.py, from
#             transformers' modeling_llama.py) with grouped-query attention (4 query heads, 2
#             key/value heads) and an untied head: a PyTorch-made Llama imported gives Kiln's
#             logits within fp32 round-off, the same greedy tokens with and without the KV cache,
#             and Kiln's first training-step loss within 1e-5 (plain causal attention on both
#             sides: hf_loss_dump runs model.doc_mask false); a Kiln llama checkpoint exported
#             gives PyTorch the logits Kiln has, its q/k/v and gate/up tensors are the row blocks
#             of the consolidated file's fused ones; export -> import -> export is byte-identical;
#             what Kiln cannot represent (rope_scaling, attention_bias, head_dim, ...) is refused
#             naming the file and the field.
#   gpu       `kiln generate` and `kiln eval` on the GPU (--device cuda) against the CPU, on `kiln
#             prep` data of the default corpus: a trained gpt2 and a llama (multi-query) generate
#             the same greedy tokens on both devices (and on the GPU without the cache), and eval
#             --data / --jsonl / --tasks give the same losses (1e-5 relative) and accuracies. Exit
#             77 (a skip) where no GPU is usable; e2e checks that refusal itself.
#   ARCH (optional 7th argument, mpi only): gpt2 (default) or llama (GQA, untied, no biases).
set -euo pipefail
CHECK=$1
KILN=$(readlink -f "$2")
SRC=$3
ARCH=${7:-gpt2}
WORK=$4/$CHECK${7:+_$7}
MPI=$5
DUMP=$(readlink -f "$6")
PY=/usr/bin/python3
GPT2="$SRC/tests/python/hf_gpt2.py"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
rm -rf "$WORK"
mkdir -p "$WORK"
cd "$WORK"
fail() {
  echo "FAIL: $*"
  exit 1
}
# expect_refusal EXIT_CODE "WORDS..." CMD...: CMD fails with that code, stderr holding every word.
expect_refusal() {
  local want=$1 words=$2
  shift 2
  set +e
  "$@" >refusal.out 2>refusal.err
  local rc=$?
  set -e
  [ "$rc" = "$want" ] || { cat refusal.err; fail "$* exited $rc, expected $want"; }
  for w in $words; do
    grep -qF -- "$w" refusal.err || { cat refusal.err; fail "$*: the error does not name '$w'"; }
  done
}
SMALL=(--config "$SRC/configs/train/tiny.yaml" --set model.vocab_size=96 --set model.d_model=32
       --set model.n_layers=2 --set model.n_heads=4 --set model.seq_len=16 --set run.threads=1
       --set schedule.warmup_steps=1 --set schedule.total_steps=4 --set data.micro_batch=4)
LLAMA=(--set model.arch=llama --set model.n_kv_heads=2 --set model.ffn_hidden=48
       --set model.tie_embeddings=false --set model.bias=false --set model.doc_mask=false)
[ "$ARCH" = llama ] && SMALL+=("${LLAMA[@]}")
LLAMA_PY="$SRC/tests/python/hf_llama.py"

case "$CHECK" in
torch)
  # PyTorch -> Kiln.
  # (weights of std 0.5: logits that depend on the input, so greedy tokens vary)
  $PY "$GPT2" make pt --vocab 96 --embd 32 --layers 2 --heads 4 --positions 16 --seed 3 --std 0.5
  PROMPT="5 17 2 88 41 9 63 0 12 95 7 33"
  $PY "$GPT2" logits pt --ids "$PROMPT" -o pt_logits.npy
  "$KILN" generate pt --prompt-ids "$PROMPT" --max-tokens 0 --logits kiln_logits.npy >/dev/null
  $PY - <<'PY'
import numpy as np
a, b = np.load("pt_logits.npy"), np.load("kiln_logits.npy")
assert a.shape == b.shape, (a.shape, b.shape)
d = np.abs(a - b).max(); s = np.abs(a).max()
print(f"PyTorch-made GPT-2 imported: logits max |diff| {d:.3g} (scale {s:.3g})")
assert s > 1 and d <= 1e-5 * s, "logits differ beyond fp32 round-off"
PY
  $PY - <<'PY' >batch.txt
import random
random.seed(7)
for _ in range(3):
    print(" ".join(str(random.randrange(96)) for _ in range(17)))
PY
  g_pt=$($PY "$GPT2" greedy pt --ids "5 17 2" --n 12)
  g_k=$("$KILN" generate pt --prompt-ids "5 17 2" --temperature 0 --max-tokens 12 --ids --no-stop)
  g_kn=$("$KILN" generate pt --prompt-ids "5 17 2" --temperature 0 --max-tokens 12 --ids --no-stop --no-cache)
  echo "greedy on the PyTorch-made model: PyTorch [$g_pt] Kiln [$g_k] Kiln without cache [$g_kn]"
  [ "$g_pt" = "$g_k" ] && [ "$g_k" = "$g_kn" ] || fail "greedy tokens differ"
  [ "$($PY -c "print(len(set('$g_pt'.split())))")" -gt 3 ] || fail "greedy tokens barely vary: [$g_pt]"
  pt_loss=$($PY "$GPT2" loss pt --batch batch.txt)
  kiln_loss=$("$DUMP" pt batch.txt)
  $PY - "$pt_loss" "$kiln_loss" <<'PY'
import json, sys
a, b = json.loads(sys.argv[1])["loss"], json.loads(sys.argv[2])["loss"]
print(f"first-step loss: PyTorch {a:.7f}, Kiln (imported) {b:.7f}")
assert abs(a - b) <= 1e-5, "first-step losses differ"
PY

  # Kiln -> PyTorch.
  "$KILN" train --quiet "${SMALL[@]}" --set run.dir=run --set run.steps=3 >train.log 2>&1
  "$KILN" checkpoint export run -o hf >export.log
  grep -q "no tokenizer" export.log || fail "synthetic data has no tokenizer: $(cat export.log)"
  for f in config.json model.safetensors generation_config.json; do
    [ -f "hf/$f" ] || fail "export lacks $f"
  done
  "$KILN" checkpoint consolidate run/checkpoints/step-00000003 -o cons.safetensors >/dev/null
  "$KILN" generate run --prompt-ids "$PROMPT" --max-tokens 0 --logits run_logits.npy >/dev/null
  $PY "$GPT2" logits hf --ids "$PROMPT" -o pt_hf_logits.npy
  PYTHONPATH="$SRC/tests/python" $PY - <<'PY'
import numpy as np
from hf_gpt2 import read_safetensors
a, b = np.load("pt_hf_logits.npy"), np.load("run_logits.npy")
d = np.abs(a - b).max(); s = np.abs(a).max()
print(f"Kiln checkpoint exported, read by PyTorch: logits max |diff| {d:.3g} (scale {s:.3g})")
assert d <= 1e-5 * max(1.0, s), "logits differ beyond fp32 round-off"
hf, meta = read_safetensors("hf/model.safetensors")
kiln, _ = read_safetensors("cons.safetensors")
assert "lm_head.weight" not in hf
names = {"wte": "transformer.wte.weight", "wpe": "transformer.wpe.weight",
         "ln_f.weight": "transformer.ln_f.weight", "ln_f.bias": "transformer.ln_f.bias"}
for l in range(2):
    for k, h, t in (("ln1", "ln_1", 0), ("ln2", "ln_2", 0), ("attn.qkv", "attn.c_attn", 1),
                    ("attn.proj", "attn.c_proj", 1), ("mlp.fc", "mlp.c_fc", 1),
                    ("mlp.proj", "mlp.c_proj", 1)):
        for s in ("weight", "bias"):
            names[f"blocks.{l}.{k}.{s}"] = (f"transformer.h.{l}.{h}.{s}", t and s == "weight")
n = 0
for k, v in names.items():
    h, t = v if isinstance(v, tuple) else (v, False)
    want = kiln[k].T if t else kiln[k]
    assert hf[h].shape == want.shape and np.array_equal(hf[h], want), k
    n += 1
assert len(hf) == n == len(kiln)
print(f"export: {n} tensors equal to the consolidated file's (Conv1D matrices transposed)")
PY
  g_pt=$($PY "$GPT2" greedy hf --ids "$PROMPT" --n 4)
  g_run=$("$KILN" generate run --prompt-ids "$PROMPT" --temperature 0 --max-tokens 4 --ids --no-stop)
  g_hf=$("$KILN" generate hf --prompt-ids "$PROMPT" --temperature 0 --max-tokens 4 --ids --no-stop)
  g_nc=$("$KILN" generate hf --prompt-ids "$PROMPT" --temperature 0 --max-tokens 4 --ids --no-stop --no-cache)
  g_again=$("$KILN" generate run --prompt-ids "$PROMPT" --temperature 0 --max-tokens 4 --ids --no-stop)
  echo "greedy: PyTorch [$g_pt] Kiln run [$g_run] export [$g_hf] no-cache [$g_nc] again [$g_again]"
  [ "$g_pt" = "$g_run" ] && [ "$g_run" = "$g_hf" ] && [ "$g_hf" = "$g_nc" ] && [ "$g_run" = "$g_again" ] ||
    fail "greedy generations differ"
  s1=$("$KILN" generate hf --prompt-ids "$PROMPT" --max-tokens 4 --ids --no-stop --seed 5 --top-k 20)
  s2=$("$KILN" generate hf --prompt-ids "$PROMPT" --max-tokens 4 --ids --no-stop --seed 5 --top-k 20)
  [ "$s1" = "$s2" ] || fail "sampling with one seed differs: [$s1] [$s2]"

  # Round trip: the export imported (init_from; one step at learning rate 0 leaves the weights
  # as they are and writes a checkpoint) and exported again: the same bytes.
  "$KILN" train --quiet "${SMALL[@]}" --set run.dir=back --set run.steps=1 --set optimizer.lr=0 \
    --set model.init_from=hf >back.log 2>&1 || { cat back.log; fail "a run from the export"; }
  latest=$(cat back/checkpoints/latest)
  "$KILN" checkpoint export "back/checkpoints/$latest" -o hf2 >/dev/null
  cmp hf/model.safetensors hf2/model.safetensors || fail "export -> import -> export changed bytes"
  cmp hf/config.json hf2/config.json || fail "config.json differs after the round trip"
  echo "round trip: export -> import -> export byte-identical"

  # Bad directories: named file and field, exit 2 (config) or 3 (data).
  cp -r hf bad
  $PY - <<'PY'
import json
c = json.load(open("bad/config.json")); c["model_type"] = "mamba"; json.dump(c, open("bad/config.json", "w"))
PY
  expect_refusal 2 "bad/config.json model_type mamba" "$KILN" generate bad --prompt-ids "1 2"
  expect_refusal 2 "bad/config.json model_type" "$KILN" train --quiet "${SMALL[@]}" --set run.dir=r2 \
    --set run.steps=1 --set model.init_from=bad
  rm -rf bad && cp -r hf bad
  $PY - <<'PY'
import json
c = json.load(open("bad/config.json")); c["n_embd"] = 64; json.dump(c, open("bad/config.json", "w"))
PY
  expect_refusal 3 "bad/model.safetensors transformer.wte.weight disagrees [96, 64]" \
    "$KILN" eval bad --tasks /dev/null
  expect_refusal 2 "bad/config.json n_embd model.d_model" "$KILN" train --quiet "${SMALL[@]}" \
    --set run.dir=r3 --set run.steps=1 --set model.init_from=bad
  rm -rf bad && cp -r hf bad
  PYTHONPATH="$SRC/tests/python" $PY - <<'PY'
from hf_gpt2 import read_safetensors, write_safetensors
t, _ = read_safetensors("bad/model.safetensors")
del t["transformer.h.1.attn.c_proj.bias"]
write_safetensors("bad/model.safetensors", t, {"format": "pt"})
PY
  expect_refusal 3 "bad/model.safetensors transformer.h.1.attn.c_proj.bias missing" \
    "$KILN" generate bad --prompt-ids "1 2"
  echo "bad directories refused naming file and field"
  ;;
torch_llama)
  # PyTorch -> Kiln.
  $PY "$LLAMA_PY" make pt --vocab 96 --hidden 32 --layers 2 --heads 4 --kv-heads 2 --ffn 48 \
    --positions 16 --seed 3 --std 0.5
  PROMPT="5 17 2 88 41 9 63 0 12 95 7 33"
  $PY "$LLAMA_PY" logits pt --ids "$PROMPT" -o pt_logits.npy
  "$KILN" generate pt --prompt-ids "$PROMPT" --max-tokens 0 --logits kiln_logits.npy >/dev/null
  $PY - <<'PY'
import numpy as np
a, b = np.load("pt_logits.npy"), np.load("kiln_logits.npy")
assert a.shape == b.shape, (a.shape, b.shape)
d = np.abs(a - b).max(); s = np.abs(a).max()
print(f"PyTorch-made Llama (GQA 4/2, untied) imported: logits max |diff| {d:.3g} (scale {s:.3g})")
assert s > 1 and d <= 1e-5 * s, "logits differ beyond fp32 round-off"
PY
  $PY - <<'PY' >batch.txt
import random
random.seed(7)
for _ in range(3):
    print(" ".join(str(random.randrange(96)) for _ in range(17)))
PY
  g_pt=$($PY "$LLAMA_PY" greedy pt --ids "5 17 2" --n 12)
  g_k=$("$KILN" generate pt --prompt-ids "5 17 2" --temperature 0 --max-tokens 12 --ids --no-stop)
  g_kn=$("$KILN" generate pt --prompt-ids "5 17 2" --temperature 0 --max-tokens 12 --ids --no-stop --no-cache)
  echo "greedy on the PyTorch-made Llama: PyTorch [$g_pt] Kiln [$g_k] Kiln without cache [$g_kn]"
  [ "$g_pt" = "$g_k" ] && [ "$g_k" = "$g_kn" ] || fail "greedy tokens differ"
  [ "$($PY -c "print(len(set('$g_pt'.split())))")" -gt 3 ] || fail "greedy tokens barely vary: [$g_pt]"
  pt_loss=$($PY "$LLAMA_PY" loss pt --batch batch.txt)
  kiln_loss=$("$DUMP" pt batch.txt)
  $PY - "$pt_loss" "$kiln_loss" <<'PY'
import json, sys
a, b = json.loads(sys.argv[1])["loss"], json.loads(sys.argv[2])["loss"]
print(f"Llama first-step loss (plain causal, no document mask): PyTorch {a:.7f}, Kiln (imported) {b:.7f}")
assert abs(a - b) <= 1e-5, "first-step losses differ"
PY

  # Kiln -> PyTorch.
  "$KILN" train --quiet "${SMALL[@]}" "${LLAMA[@]}" --set run.dir=run --set run.steps=3 >train.log 2>&1 ||
    { cat train.log; fail "llama training run"; }
  "$KILN" checkpoint export run -o hf >export.log
  "$KILN" checkpoint consolidate run/checkpoints/step-00000003 -o cons.safetensors >/dev/null
  "$KILN" generate run --prompt-ids "$PROMPT" --max-tokens 0 --logits run_logits.npy >/dev/null
  $PY "$LLAMA_PY" logits hf --ids "$PROMPT" -o pt_hf_logits.npy
  PYTHONPATH="$SRC/tests/python" $PY - <<'PY'
import json
import numpy as np
from hf_gpt2 import read_safetensors
a, b = np.load("pt_hf_logits.npy"), np.load("run_logits.npy")
d = np.abs(a - b).max(); s = np.abs(a).max()
print(f"Kiln llama checkpoint exported, read by PyTorch: logits max |diff| {d:.3g} (scale {s:.3g})")
assert d <= 1e-5 * max(1.0, s), "logits differ beyond fp32 round-off"
cfg = json.load(open("hf/config.json"))
assert cfg["model_type"] == "llama" and cfg["architectures"] == ["LlamaForCausalLM"]
assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["intermediate_size"]) == (4, 2, 48)
assert cfg["tie_word_embeddings"] is False and cfg["attention_bias"] is False
hf, _ = read_safetensors("hf/model.safetensors")
kiln, _ = read_safetensors("cons.safetensors")
names = {"model.embed_tokens.weight": kiln["wte"], "model.norm.weight": kiln["ln_f.weight"],
         "lm_head.weight": kiln["lm_head.weight"]}
for l in range(2):
    p, k = f"model.layers.{l}.", f"blocks.{l}."
    q, kk, v = np.split(kiln[k + "attn.qkv.weight"], [32, 48])
    g, u = np.split(kiln[k + "mlp.fc.weight"], 2)
    names.update({p + "input_layernorm.weight": kiln[k + "ln1.weight"],
                  p + "post_attention_layernorm.weight": kiln[k + "ln2.weight"],
                  p + "self_attn.q_proj.weight": q, p + "self_attn.k_proj.weight": kk,
                  p + "self_attn.v_proj.weight": v,
                  p + "self_attn.o_proj.weight": kiln[k + "attn.proj.weight"],
                  p + "mlp.gate_proj.weight": g, p + "mlp.up_proj.weight": u,
                  p + "mlp.down_proj.weight": kiln[k + "mlp.proj.weight"]})
for n, want in names.items():
    assert hf[n].shape == want.shape and np.array_equal(hf[n], want), n
assert len(hf) == len(names), sorted(set(hf) - set(names))
print(f"llama export: {len(hf)} tensors equal to the consolidated file's (q/k/v, gate/up: row blocks)")
PY
  g_pt=$($PY "$LLAMA_PY" greedy hf --ids "$PROMPT" --n 4)
  g_run=$("$KILN" generate run --prompt-ids "$PROMPT" --temperature 0 --max-tokens 4 --ids --no-stop)
  g_hf=$("$KILN" generate hf --prompt-ids "$PROMPT" --temperature 0 --max-tokens 4 --ids --no-stop)
  g_cons=$("$KILN" generate cons.safetensors --prompt-ids "$PROMPT" --temperature 0 --max-tokens 4 --ids --no-stop)
  echo "llama greedy: PyTorch [$g_pt] Kiln run [$g_run] export [$g_hf] consolidated file [$g_cons]"
  [ "$g_pt" = "$g_run" ] && [ "$g_run" = "$g_hf" ] && [ "$g_hf" = "$g_cons" ] || fail "greedy generations differ"

  # Round trip: export -> import (init_from, lr 0) -> export: the same bytes.
  "$KILN" train --quiet "${SMALL[@]}" "${LLAMA[@]}" --set run.dir=back --set run.steps=1 \
    --set optimizer.lr=0 --set model.init_from=hf >back.log 2>&1 || { cat back.log; fail "a run from the export"; }
  latest=$(cat back/checkpoints/latest)
  "$KILN" checkpoint export "back/checkpoints/$latest" -o hf2 >/dev/null
  cmp hf/model.safetensors hf2/model.safetensors || fail "llama export -> import -> export changed bytes"
  cmp hf/config.json hf2/config.json || fail "llama config.json differs after the round trip"
  echo "llama round trip: export -> import -> export byte-identical"

  # What Kiln cannot represent: the file and the field named, exit 2.
  for edit in 'rope_scaling={"rope_type": "llama3", "factor": 8.0}' 'attention_bias=true' \
              'head_dim=16' 'hidden_act="gelu"' 'num_local_experts=8' 'model_type="mistral"'; do
    field=${edit%%=*}
    rm -rf bad && cp -r hf bad
    $PY - "$edit" <<'PY'
import json, sys
k, v = sys.argv[1].split("=", 1)
c = json.load(open("bad/config.json")); c[k] = json.loads(v); json.dump(c, open("bad/config.json", "w"))
PY
    expect_refusal 2 "bad/config.json $field" "$KILN" generate bad --prompt-ids "1 2"
  done
  expect_refusal 2 "hf/config.json num_key_value_heads model.n_kv_heads" "$KILN" train --quiet \
    "${SMALL[@]}" "${LLAMA[@]}" --set model.n_kv_heads=4 --set run.dir=r5 --set run.steps=1 --set model.init_from=hf
  rm -rf bad && cp -r hf bad
  PYTHONPATH="$SRC/tests/python" $PY - <<'PY'
from hf_gpt2 import read_safetensors, write_safetensors
t, _ = read_safetensors("bad/model.safetensors")
del t["model.layers.1.self_attn.v_proj.weight"]
write_safetensors("bad/model.safetensors", t, {"format": "pt"})
PY
  expect_refusal 3 "bad/model.safetensors model.layers.1.self_attn.v_proj.weight missing" \
    "$KILN" generate bad --prompt-ids "1 2"
  # Meta's original release (interleaved RoPE rows): refused, pointing at HF's converter.
  mkdir -p meta && echo '{"dim": 64, "n_layers": 2, "n_heads": 4}' >meta/params.json && : >meta/consolidated.00.pth
  expect_refusal 2 "meta/params.json convert_llama_weights_to_hf.py interleaved" \
    "$KILN" checkpoint export meta --format hf -o meta_out
  expect_refusal 2 "model.init_from meta/params.json convert_llama_weights_to_hf.py" "$KILN" train --quiet \
    "${SMALL[@]}" "${LLAMA[@]}" --set run.dir=r6 --set run.steps=1 --set model.init_from=meta
  echo "llama: what Kiln cannot represent is refused naming file and field"
  ;;
mpi)
  "$MPI" -np 4 --oversubscribe "$KILN" train --quiet "${SMALL[@]}" --set run.dir=z3 --set run.steps=2 \
    --set parallel.tp=2 --set parallel.zero_stage=3 >z3.log 2>&1 || { cat z3.log; fail "DP=2 x TP=2 ZeRO-3 run"; }
  step=z3/checkpoints/step-00000002
  grep -q '"tp_partitions": 2' $step/meta.json || fail "not a TP checkpoint"
  ls $step/shard-tp*-dp* >/dev/null || fail "no per-rank shard files"
  "$KILN" checkpoint consolidate $step -o z3.safetensors >/dev/null
  "$KILN" checkpoint export $step -o from_shards >/dev/null
  "$KILN" checkpoint export z3.safetensors -o from_cons >/dev/null
  "$KILN" checkpoint export $step -o from_shards_bf16 --dtype bf16 --max-shard-size 20K >/dev/null
  "$KILN" checkpoint export z3.safetensors -o from_cons_bf16 --dtype bf16 --max-shard-size 20K >/dev/null
  diff -r from_shards from_cons || fail "the TP=2 x ZeRO-3 export differs from the consolidated one"
  diff -r from_shards_bf16 from_cons_bf16 || fail "bf16 sharded exports differ"
  [ -f from_shards_bf16/model.safetensors.index.json ] || fail "no index for a sharded export"
  echo "TP=2 x ZeRO-3 export == consolidated export, byte for byte ($(ls from_shards | wc -l) files; bf16 in $(ls from_shards_bf16/model-*.safetensors | wc -l) shards)"
  for init in from_shards z3.safetensors; do
    "$MPI" -np 4 --oversubscribe "$KILN" train --quiet "${SMALL[@]}" --set run.dir="i_$init" --set run.steps=3 \
      --set parallel.tp=2 --set parallel.zero_stage=3 --set model.init_from=$init >"i_$init.log" 2>&1 ||
      { cat "i_$init.log"; fail "init_from=$init under DP=2 x TP=2 ZeRO-3"; }
  done
  $PY - <<'PY'
import json
a = [json.loads(l)["loss"] for l in open("i_from_shards/metrics.jsonl")]
b = [json.loads(l)["loss"] for l in open("i_z3.safetensors/metrics.jsonl")]
print(f"DP=2 x TP=2 ZeRO-3 from the HF export: {a}; from the consolidated file: {b}")
assert a == b and len(a) == 3, "losses differ"
PY
  ;;
e2e)
  "$SRC/tools/default_corpus" corpus >/dev/null
  "$KILN" prep --input corpus --output data --threads 2 --set split.val_fraction=0.05 >/dev/null 2>prep.log ||
    { cat prep.log; fail "kiln prep"; }
  cat >tasks.jsonl <<'EOF'
{"context": "The capital of France is", "choices": [" Paris", " a banana", " blue"], "label": 0}
{"context": "Two plus two equals", "choices": [" four", " the sea"], "label": 0}
{"context": "", "choices": ["hello world", "zzzz qqqq"], "label": 1}
{"context": "def f(x):\n    return ", "choices": ["x + 1", "the end of the story"], "label": 0}
EOF
  "$KILN" train --quiet --config "$SRC/configs/train/tiny.yaml" --set data.manifest=data \
    --set model.d_model=32 --set model.n_layers=2 --set model.n_heads=2 --set model.seq_len=64 \
    --set run.dir=run --set run.steps=20 --set run.threads=2 --set eval.every_steps=10 \
    --set 'eval.tasks=[tasks.jsonl]' >train.log 2>&1 || { cat train.log; fail "kiln train"; }
  "$KILN" checkpoint export run -o hf --dtype fp32 >export.log
  for f in config.json model.safetensors generation_config.json tokenizer_config.json tokenizer.json; do
    [ -f "hf/$f" ] || fail "export lacks $f"
  done
  eos=$($PY -c "import json; print(json.load(open('data/manifest.json'))['tokenizer']['eos_id'])")
  $PY -c "import json,sys; c=json.load(open('hf/config.json')); sys.exit(0 if c['eos_token_id']==$eos else 1)" ||
    fail "config.json eos_token_id is not the tokenizer's $eos"
  # (a 20-step model's greedy continuation is newlines: sample, with one seed, to see text)
  G=(--prompt "The history of" --temperature 1 --top-k 50 --seed 4 --max-tokens 12 --no-stop)
  "$KILN" generate run "${G[@]}" >gen_run.txt
  "$KILN" generate hf "${G[@]}" >gen_hf.txt
  echo "generate (run): $(cat gen_run.txt)"
  cmp gen_run.txt gen_hf.txt || fail "the export generates other text: [$(cat gen_hf.txt)]"
  head -c 14 gen_run.txt | grep -q "^The history of" || fail "the prompt is not echoed first"
  [ "$(wc -c <gen_run.txt)" -gt 20 ] || fail "nothing generated"
  [ "$("$KILN" generate run "${G[@]}" --ids | wc -w)" = 12 ] || fail "not 12 tokens"
  echo "the quick brown fox" | "$KILN" generate hf --max-tokens 3 --temperature 0.8 --top-p 0.9 \
    --repetition-penalty 1.2 --seed 3 >stdin.out
  grep -q "the quick brown fox" stdin.out || fail "stdin prompt not used"
  printf 'first prompt\nsecond prompt\n' >prompts.txt
  [ "$("$KILN" generate run --prompts-file prompts.txt --max-tokens 2 --temperature 0 --ids | wc -l)" = 2 ] ||
    fail "--prompts-file: one line per prompt"

  "$KILN" eval run --data data --json --max-docs 20 >eval_data.json
  cat >texts.jsonl <<'EOF'
{"text": "The cat sat on the mat. It was a sunny day.", "domain": "prose"}
{"text": "def add(a, b):\n    return a + b\n", "domain": "code"}
{"text": "Another sentence about the weather and the sea.", "domain": "prose"}
EOF
  "$KILN" eval hf --jsonl texts.jsonl --json >eval_jsonl.json
  "$KILN" eval run --tasks tasks.jsonl --json >eval_tasks.json
  "$KILN" eval run --tasks tasks.jsonl >eval_tasks.txt
  grep -q "acc_norm" eval_tasks.txt || fail "the table has no acc_norm column"
  $PY - <<'PY'
import json, math
d = json.load(open("eval_data.json"))
man = json.load(open("data/manifest.json"))
val_domains = {s["domain"] for s in man["shards"] if s.get("split") == "val"}
assert set(d["domains"]) == val_domains, (set(d["domains"]), val_domains)
for name, r in list(d["domains"].items()) + [("total", d["total"])]:
    assert r["tokens"] > 0 and r["bytes"] > 0 and 0 < r["loss"] < 20, (name, r)
    bpb = r["loss"] * r["tokens"] / math.log(2) / r["bytes"]
    assert abs(bpb - r["bits_per_byte"]) < 1e-9 * max(1, bpb), (name, r)
print("eval --data:", {k: round(v["loss"], 4) for k, v in d["domains"].items()}, "bits/byte", round(d["total"]["bits_per_byte"], 4))
j = json.load(open("eval_jsonl.json"))
assert set(j["domains"]) == {"prose", "code"} and j["domains"]["prose"]["docs"] == 2
assert j["domains"]["code"]["bytes"] == len("def add(a, b):\n    return a + b\n")
t = json.load(open("eval_tasks.json"))["tasks"]["tasks"]
assert t["examples"] == 4 and all(x in (0, .25, .5, .75, 1) for x in (t["acc"], t["acc_norm"])), t
# The training loop's eval.tasks (steps 10 and 20) with the trainer's model: step 20's equals
# `kiln eval` of the step-20 checkpoint.
m = [json.loads(l) for l in open("run/metrics.jsonl")]
steps = [r["step"] for r in m if "tasks" in r]
assert steps == [10, 20], steps
last = m[-1]["tasks"]["tasks"]
assert last == {"acc": t["acc"], "acc_norm": t["acc_norm"]}, (last, t)
print("eval.tasks in training:", {r["step"]: r["tasks"]["tasks"] for r in m if "tasks" in r})
print("eval --jsonl and --tasks:", j["total"], t)
PY
  /usr/bin/python3 "$SRC/tools/plot" run -o plots >/dev/null
  [ -f plots/tasks.png ] || fail "tools/plot drew no tasks.png"
  echo '{"context": "x", "choices": ["a", "b"], "label": 5}' >bad_task.jsonl
  expect_refusal 3 "bad_task.jsonl:1 label" "$KILN" eval run --tasks bad_task.jsonl
  # --device: an unknown name, and cuda where no GPU is usable, exit 2 naming the flag; the
  # default is the device of the run's config.yaml (a copy of the step directory that says cuda).
  expect_refusal 2 "--device tpu" "$KILN" generate run --prompt-ids "1 2" --device tpu
  expect_refusal 2 "--device tpu" "$KILN" eval run --tasks tasks.jsonl --device tpu
  if ! "$KILN" generate run --prompt-ids "1 2" --max-tokens 1 --device cuda >/dev/null 2>cuda.err; then
    expect_refusal 2 "--device cuda 'cuda': device: cpu" "$KILN" generate run --prompt-ids "1 2" --device cuda
    expect_refusal 2 "--device cuda 'cuda':" "$KILN" eval run --tasks tasks.jsonl --device cuda
    step=$(ls -d run/checkpoints/step-* | tail -n 1)
    cp -r "$step" on_cuda
    sed -i 's/^device: cpu$/device: cuda/' on_cuda/config.yaml
    grep -q '^device: cuda$' on_cuda/config.yaml || fail "no 'device: cpu' line in $step/config.yaml"
    expect_refusal 2 "--device cuda config.yaml --device cpu" "$KILN" generate on_cuda --prompt-ids "1 2"
    [ "$("$KILN" generate on_cuda --prompt-ids "1 2" --max-tokens 2 --ids --no-stop --device cpu | wc -w)" = 2 ] ||
      fail "--device cpu does not override the run's device"
    echo "--device cuda without a GPU: refused (exit 2) naming --device"
  fi
  ;;
gpu)
  # Skip where no GPU is usable (the probe's error says so; a one-step model on synthetic data);
  # any other failure is a failure.
  "$KILN" train --quiet "${SMALL[@]}" --set run.dir=probe --set run.steps=1 --set 'data.manifest=""' \
    >probe.log 2>&1 || { cat probe.log; fail "kiln train (probe)"; }
  if ! "$KILN" generate probe --prompt-ids 1 --max-tokens 1 --device cuda >/dev/null 2>probe.err; then
    if grep -q "no usable GPU\|built without CUDA\|no CUDA device" probe.err; then
      echo "SKIP: no GPU: $(head -n 1 probe.err)"
      exit 77
    fi
    cat probe.err
    fail "kiln generate --device cuda failed"
  fi
  printf '%s\n' '{"context": "The capital of France is", "choices": [" Paris", " a banana", " blue"], "label": 0}' \
    '{"context": "Two plus two equals", "choices": [" four", " the sea"], "label": 0}' \
    '{"context": "def f(x):\n    return ", "choices": ["x + 1", "the end of the story"], "label": 0}' >tasks.jsonl
  printf '%s\n' '{"text": "The cat sat on the mat.", "domain": "prose"}' \
    '{"text": "def add(a, b):\n    return a + b\n", "domain": "code"}' >texts.jsonl
  "$SRC/tools/default_corpus" corpus >/dev/null
  "$KILN" prep --input corpus --output data --threads 2 --set split.val_fraction=0.05 >/dev/null 2>prep.log ||
    { cat prep.log; fail "kiln prep"; }
  for arch in gpt2 llama; do
    more=()
    [ "$arch" = llama ] && more=(--set model.arch=llama --set model.n_kv_heads=1 --set model.ffn_hidden=96
                                 --set model.tie_embeddings=false --set model.bias=false)
    "$KILN" train --quiet --config "$SRC/configs/train/tiny.yaml" --set data.manifest=data \
      --set model.d_model=32 --set model.n_layers=2 --set model.n_heads=2 --set model.seq_len=64 \
      --set run.dir=$arch --set run.steps=30 --set run.threads=2 "${more[@]}" >$arch.log 2>&1 ||
      { cat $arch.log; fail "kiln train ($arch)"; }
    G=(--prompt "The history of" --temperature 0 --max-tokens 40 --ids --no-stop)
    cpu=$("$KILN" generate $arch "${G[@]}" --device cpu)
    gpu=$("$KILN" generate $arch "${G[@]}" --device cuda)
    gpu_nc=$("$KILN" generate $arch "${G[@]}" --device cuda --no-cache)
    [ "$cpu" = "$gpu" ] || fail "$arch: greedy tokens on the GPU [$gpu] are not the CPU's [$cpu]"
    [ "$gpu" = "$gpu_nc" ] || fail "$arch: the GPU's cache changes its greedy tokens [$gpu_nc]"
    echo "$arch greedy, CPU = GPU = GPU without the cache: $gpu"
    for dev in cpu cuda; do
      "$KILN" eval $arch --data data --jsonl texts.jsonl --tasks tasks.jsonl --max-docs 10 --json \
        --device $dev >eval_$arch.$dev.json
    done
    $PY - "eval_$arch.cpu.json" "eval_$arch.cuda.json" <<'PY'
import json, sys
c, g = (json.load(open(p)) for p in sys.argv[1:3])
assert set(c["domains"]) == set(g["domains"]), (c["domains"], g["domains"])
for d in list(c["domains"]) + ["total"]:
    a, b = (x["total"] if d == "total" else x["domains"][d] for x in (c, g))
    assert a["tokens"] == b["tokens"] and a["bytes"] == b["bytes"], (d, a, b)
    assert abs(a["loss"] - b["loss"]) <= 1e-5 * a["loss"], (d, a["loss"], b["loss"])
assert c["tasks"] == g["tasks"], (c["tasks"], g["tasks"])
print(sys.argv[1], "CPU vs GPU: total loss", c["total"]["loss"], g["total"]["loss"], "tasks", g["tasks"])
PY
  done
  ;;
*)
  fail "unknown check $CHECK"
  ;;
esac
echo "hf_models $CHECK: ok"
