#!/usr/bin/env bash
# model.arch: llama through the CLI on `kiln prep` data of the default corpus (issue 30), one check
# per invocation:
#   train_llama.sh CHECK KILN_BINARY SOURCE_DIR WORK_DIR MPIEXEC
# CHECK:
#   train     configs/train/llama-tiny.yaml (made smaller: d_model 64, 2 layers, context 64) on
#             loader data with document masking: the loss falls (the mean of the last 10 of 60
#             steps at least 1.0 below the first step's); activation checkpointing selective and
#             full repeat the losses bit for bit; model.doc_mask: false trains a different model
#             (its losses differ from step 2 on); bf16 and fp16 runs stay finite and within 2e-2
#             relative of fp32 over 10 steps; `kiln checkpoint consolidate` writes the llama
#             tensors (lm_head, no wpe, no biases) and model.init_from starts a run from them.
#   parallel  DP=2 x TP=2 ZeRO-3 (4 ranks, oversubscribed) with the document mask vs one process,
#             fp32, 10 steps: losses within 1e-5 relative.
#   gpt2_doc_mask  the same for model.arch: gpt2 (configs/train/tiny.yaml made smaller) with
#             model.doc_mask: true (learned positions restart at document starts; the
#             vocabulary-parallel embedding's too), and model.doc_mask: false gives other losses.
#   refuse    bad configs are exit 2 naming the key before anything is allocated:
#             model.n_kv_heads not dividing model.n_heads, parallel.tp not dividing
#             model.n_kv_heads, an odd head dimension, model.doc_mask on synthetic data.
source "$(dirname "$0")/mpi_train_common.sh" "$1" "$2" "$3" "$4" "$5" llama
if [ "$CHECK" != refuse ]; then
  "$SRC/tools/default_corpus" corpus >/dev/null
  "$KILN" prep --input corpus --output data --threads 2 >/dev/null 2>prep.log
fi
LT=(--config "$SRC/configs/train/llama-tiny.yaml" --set data.manifest=data --set run.threads=2
    --set model.d_model=64 --set model.n_layers=2 --set model.seq_len=64 --set model.ffn_hidden=160
    --set data.micro_batch=8 --set schedule.warmup_steps=5 --set checkpoint.at_end=false)
lt() {  # lt RUN_DIR STEPS [extra...]
  local dir=$1 steps=$2
  shift 2
  "$KILN" train --quiet "${LT[@]}" --set run.dir="$dir" --set run.steps="$steps" \
    --set schedule.total_steps="$steps" "$@" >"$dir.log" 2>&1
}
refused() {  # refused NAME KEY NP kiln-train-flags...: exit 2 and KEY in the message
  local name=$1 key=$2 np=$3 rc
  shift 3
  set +e
  if [ "$np" = 1 ]; then
    "$KILN" train --quiet "$@" >"$name.out" 2>&1
  else
    "$MPI" -np "$np" --oversubscribe "$KILN" train --quiet "$@" >"$name.out" 2>&1
  fi
  rc=$?
  set -e
  if [ "$rc" != 2 ] || ! grep -q "$key" "$name.out"; then
    echo "$name: exit $rc, expected 2 naming $key"
    cat "$name.out"
    exit 1
  fi
  echo "$name: refused (exit 2): $(grep -m1 "$key" "$name.out")"
}
case "$CHECK" in
train)
  lt mask 60
  lt sel 60 --set activation_checkpointing=selective
  lt full 60 --set activation_checkpointing=full --set checkpoint.at_end=true
  lt nomask 10 --set model.doc_mask=false
  lt bf16 10 --set precision=bf16
  lt fp16 10 --set precision=fp16
  "$KILN" checkpoint consolidate "full/checkpoints/$(cat full/checkpoints/latest)" -o full.safetensors \
    >consolidate.log
  lt init 2 --set model.init_from="$PWD/full.safetensors" --set optimizer.lr=0
  /usr/bin/python3 - <<'PY'
import json, struct
def losses(run):
    return [j["loss"] for j in map(json.loads, open(run + "/metrics.jsonl")) if "loss" in j and "step" in j]
mask, sel, full = losses("mask"), losses("sel"), losses("full")
first, last = mask[0], sum(mask[-10:]) / 10
print(f"llama-tiny with document masking on kiln prep data: loss {first:.3f} -> {last:.3f} (mean of the last 10 of {len(mask)})")
assert len(mask) == 60 and last <= first - 1.0, "the loss does not fall"
assert sel == mask and full == mask, "activation checkpointing changed the losses"
print("activation checkpointing selective / full: the same losses bit for bit")
nomask = losses("nomask")
d = max(abs(a - b) for a, b in zip(nomask[1:], mask[1:10]))
print(f"model.doc_mask false: losses differ from the masked run by up to {d:.2e} over steps 2-10")
assert d > 1e-4, "the document mask changes nothing: is it applied?"
for p in ("bf16", "fp16"):
    l = losses(p)
    worst = max(abs(a - b) / b for a, b in zip(l, mask[:10]))
    print(f"{p}: 10 steps within {worst:.2e} relative of fp32")
    assert len(l) == 10 and worst < 2e-2, p
with open("full.safetensors", "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    names = set(json.loads(f.read(n))) - {"__metadata__"}
assert "lm_head.weight" in names and "wpe" not in names and not any(n.endswith(".bias") for n in names), names
init = losses("init")
print(f"consolidated: {len(names)} tensors (lm_head, no wpe, no biases); model.init_from starts at loss {init[0]:.4f} "
      f"(the run it came from ended at {full[-1]:.4f})")
assert len(init) == 2 and init[0] < first - 0.5
PY
  ;;
gpt2_doc_mask)
  GT=(--config "$SRC/configs/train/tiny.yaml" --set data.manifest=data --set model.d_model=64
      --set model.n_layers=2 --set model.seq_len=512 --set schedule.warmup_steps=5
      --set checkpoint.at_end=false --set run.steps=10 --set schedule.total_steps=10)
  "$KILN" train --quiet "${GT[@]}" --set run.threads=2 --set run.dir=one --set data.micro_batch=4 \
    --set model.doc_mask=true >one.log 2>&1
  "$KILN" train --quiet "${GT[@]}" --set run.threads=2 --set run.dir=nomask --set data.micro_batch=4 \
    --set model.doc_mask=false >nomask.log 2>&1
  "$MPI" -np 4 --oversubscribe "$KILN" train --quiet "${GT[@]}" --set run.threads=1 --set run.dir=dp2tp2 \
    --set data.micro_batch=2 --set parallel.tp=2 --set parallel.zero_stage=3 \
    --set model.doc_mask=true >dp2tp2.log 2>&1
  /usr/bin/python3 - <<'PY'
import json
def losses(run):
    return [j["loss"] for j in map(json.loads, open(run + "/metrics.jsonl")) if "loss" in j and "step" in j]
one, par, nomask = losses("one"), losses("dp2tp2"), losses("nomask")
worst = max(abs(a - b) / abs(b) for a, b in zip(par, one))
print(f"document-masked gpt2, DP=2 x TP=2 ZeRO-3 vs one process: 10 steps, max relative loss difference {worst:.2e}")
assert len(one) == len(par) == 10 and worst < 1e-5
d = max(abs(a - b) for a, b in zip(nomask, one))
print(f"gpt2 model.doc_mask false: losses differ from the masked run by up to {d:.2e}")
assert d > 1e-4, "the document mask changes nothing: is it applied?"
PY
  ;;
parallel)
  lt one 10 --set data.micro_batch=4
  "$MPI" -np 4 --oversubscribe "$KILN" train --quiet "${LT[@]}" --set run.threads=1 --set run.dir=dp2tp2 \
    --set run.steps=10 --set schedule.total_steps=10 --set data.micro_batch=2 --set parallel.tp=2 \
    --set parallel.zero_stage=3 >dp2tp2.log 2>&1
  /usr/bin/python3 - <<'PY'
import json
def losses(run):
    return [j["loss"] for j in map(json.loads, open(run + "/metrics.jsonl")) if "loss" in j and "step" in j]
one, par = losses("one"), losses("dp2tp2")
worst = max(abs(a - b) / abs(b) for a, b in zip(par, one))
print(f"document-masked llama, DP=2 x TP=2 ZeRO-3 vs one process: 10 steps, max relative loss difference {worst:.2e}")
assert len(one) == len(par) == 10 and worst < 1e-5
PY
  ;;
refuse)
  refused kv model.n_kv_heads 1 "${MODEL[@]}" --set model.n_kv_heads=3 --set run.dir=r1
  refused tpkv model.n_kv_heads 2 "${MODEL[@]}" --set model.n_kv_heads=1 --set parallel.tp=2 \
    --set run.dir=r2
  refused odd model.n_heads 1 "${MODEL[@]}" --set model.d_model=36 --set run.dir=r3
  refused synth model.doc_mask 1 "${MODEL[@]}" --set model.doc_mask=true --set run.dir=r4
  ;;
*)
  echo "unknown check $CHECK"
  exit 2
  ;;
esac
echo "train_llama $CHECK: PASS"
