#!/usr/bin/env bash
# Tensor-parallel training under mpirun (ctest train_tp_*): one check per invocation.
#   train_tp.sh CHECK KILN_BINARY SOURCE_DIR WORK_DIR MPIEXEC [gpt2|llama]
# CHECK:
#   equivalence  TP=2 (2 ranks) vs one process, and DP=2 x TP=2 (4 ranks, oversubscribed) vs DP=2,
#                with the same data, seed and global batch, fp32, 10 steps: losses within 1e-5
#                relative, final parameters within 1e-5 (absolute, element-wise); the same with
#                full activation checkpointing; the tensor-parallel all-reduce moves per step what
#                `kiln plan --json` says (within 1%), and the data-parallel one too under
#                DP x TP. Every TP rank writes its own checkpoint files (meta.json records every
#                tensor's TP split), and writing checks that the replicated parameters are
#                bit-identical on every TP rank. `kiln checkpoint consolidate` of the TP
#                checkpoint writes whole tensors, and one process loads it. bf16 and fp16 TP=2
#                runs stay within 1e-3 / 1e-4 of one process, and an overflow injected on the
#                last rank only is skipped by every rank at the same step. A vocabulary not
#                divisible by tp is refused (exit 2, the key named).
#   zero         DP=2 x TP=2 with ZeRO-1, -2 and -3 (and ZeRO-3 with full activation
#                checkpointing, and with an overflow injected on the last rank) vs DP=2 ZeRO-0
#                (no TP), fp32, 10 steps (and fp16 DP=2 x TP=2 ZeRO-3 vs ZeRO-0, the overflow
#                skipped by every rank at the same step): losses within 1e-5 relative, final parameters within
#                1e-5; bytes per step per collective as `kiln plan` says (within 1%): the
#                data-parallel part is 2x (ZeRO-1/2) or 3x (ZeRO-3) each TP rank's own parameter
#                bytes, plus the TP all-reduces; model-state bytes per rank as the plan says
#                (within 5%). 4 shard files (2 TP x 2 DP) and meta.json with every tensor's split.
#   resume       a TP=2 run stopped at step 5 and resumed on TP=2 repeats the uninterrupted
#                run's losses bit for bit; resumed on one process (tp 1) and a one-process
#                checkpoint resumed on TP=2 continue within 1e-5 relative; DP=2 x TP=2 ZeRO-3
#                resumes bit-identically on the same layout, and reshards onto DP=1 x TP=2
#                ZeRO-0 (another DP size and ZeRO stage) and onto DP=2 ZeRO-1 without TP
#                (another TP size) within 1e-5. The reverse of `kiln checkpoint consolidate`:
#                a consolidated file starts a DP=2 x TP=2 ZeRO-3 run (model.init_from) with the
#                file's weights bit for bit; a file of another shape is exit 2 naming the key.
source "$(dirname "$0")/mpi_train_common.sh"
TP=(--set parallel.tp=2)

case "$CHECK" in
equivalence)
  CK=(--set checkpoint.every_steps=10)
  FULL=(--set activation_checkpointing=full)
  train 1 4 one 10 "${CK[@]}" 2>one.log
  train 2 4 tp2 10 "${CK[@]}" "${TP[@]}" 2>tp2.log
  train 1 4 onef 10 "${CK[@]}" "${FULL[@]}" 2>onef.log
  train 2 4 tp2f 10 "${CK[@]}" "${TP[@]}" "${FULL[@]}" 2>tp2f.log
  # bf16 and fp16; an overflow injected on the last rank only at step 3 (rank 0 sees finite
  # gradients of its own, so its skip is the agreed decision).
  for p in bf16 fp16; do
    train 1 4 "one$p" 10 --set precision=$p --set stability.inject_overflow_at=[3] 2>"one$p.log"
    train 2 4 "tp2$p" 10 --set precision=$p --set stability.inject_overflow_at=[3] "${TP[@]}" \
      "${CK[@]}" 2>"tp2$p.log"
  done
  train 2 2 dp2 10 "${CK[@]}" 2>dp2.log
  train 4 2 dp2tp2 10 "${CK[@]}" "${TP[@]}" 2>dp2tp2.log
  # A vocabulary that does not split over the ranks is a config error naming the key (exit 2).
  set +e
  train 2 4 badv 2 "${TP[@]}" --set model.vocab_size=255 >badv.out 2>&1
  rc=$?
  set -e
  [ "$rc" = 2 ] && grep -q "model.vocab_size" badv.out ||
    { echo "vocab_size 255 with tp 2: exit $rc"; cat badv.out; exit 1; }
  "$KILN" plan "${MODEL[@]}" --set data.micro_batch=4 --world 2 --json >plan2.json
  "$KILN" plan "${MODEL[@]}" --set data.micro_batch=2 --world 4 --json >plan4.json
  grep -q "replicated tensors identical on 2 tensor-parallel ranks" tp2.log ||
    { echo "no replicated-tensor check in the TP=2 log"; cat tp2.log; exit 1; }
  # One file a single process can load: consolidate the TP checkpoints (every TP rank wrote its
  # own slices), then train one more step from one on one process.
  for run in tp2 tp2f dp2tp2; do
    "$KILN" checkpoint consolidate $run/checkpoints/step-00000010 -o $run.safetensors >/dev/null
  done
  cp -r tp2 tp2one
  train 1 4 tp2one 11 --resume 2>tp2one.log
  grep -q "resumed from" tp2one.log || { echo "one process did not load the TP checkpoint"; cat tp2one.log; exit 1; }
  PYTHONPATH="$SRC/tests/python" /usr/bin/python3 - <<'PY'
import json, os
import numpy as np
from train_compare import *

for label, ra, rb in (("TP=2 vs one process", "one", "tp2"),
                      ("TP=2 vs one process, full activation checkpointing", "onef", "tp2f"),
                      ("DP=2 x TP=2 vs DP=2", "dp2", "dp2tp2")):
    compare(label, ra, rb, grad_norm=True, fell=True)

# bf16 / fp16: each row-parallel partial sum is rounded to the activation type before the fp32
# sum (one more rounding than one process), a relative error of up to 2^-9 (bf16) / 2^-12 (fp16)
# per element that averages out over the B*T tokens of the loss: limits 1e-3 / 1e-4 relative.
for p, tol in (("bf16", 1e-3), ("fp16", 1e-4)):
    compare(f"TP=2 vs one process, {p}", f"one{p}", f"tp2{p}", tol=tol, params=False)
    b = metrics(f"tp2{p}")
    skips = [r["step"] for r in b if r["skipped"]]
    print(f"TP=2 {p}: steps skipped for the overflow on the last rank: {skips} (want [3], as one "
          f"process: {[r['step'] for r in metrics(f'one{p}') if r['skipped']]})")
    check(f"{p} overflow skip", skips == [3] and b[2]["skip_reason"] == "overflow")

for run, path, dp, ac in (("tp2", "plan2.json", 1, "none"), ("tp2f", "plan2.json", 1, "full"),
                          ("dp2tp2", "plan4.json", 2, "none")):
    row = plan_row(path, 2, dp, 0, ac)
    check(f"{run} trainable", row["trainable"])
    check_comm(run, row)

# The TP checkpoint: one file per TP rank, every tensor's split in meta.json; consolidated, the
# whole shapes of one process.
ck = "tp2/checkpoints/step-00000010"
meta = json.load(open(f"{ck}/meta.json"))
files = sorted(f for f in os.listdir(ck) if f.endswith(".safetensors"))
print(f"TP=2 checkpoint: {files}; meta.json tp {meta['tp']}, tp_partitions {meta['tp_partitions']}")
check("TP shard files", files == meta["files"] == ["shard-tp00000-of-00002-dp00000-of-00001.safetensors",
                                                    "shard-tp00001-of-00002-dp00000-of-00001.safetensors"])
split = {t["name"]: t["tp_split"] for t in meta["tensors"]}
import os
# llama (tests/mpi_train_common.sh): q, k, v of 4 and 2 heads of 8 - parts of 32, 16, 16 rows.
qkv_split = ({"dim": 0, "parts": 3} if os.environ["KILN_TEST_ARCH"] == "gpt2"
             else {"dim": 0, "parts": 3, "part_rows": [32, 16, 16]})
check("meta.json TP splits", split["wte"] == {"dim": 0, "parts": 1}
      and split["blocks.0.attn.qkv.weight"] == qkv_split
      and split["blocks.0.attn.proj.weight"] == {"dim": 1, "parts": 1}
      and split.get("wpe") is None and split["ln_f.weight"] is None)
cons, one = tensors("tp2.safetensors"), tensors("one")
check("consolidated TP checkpoint has one process's tensors and shapes",
      cons.keys() == one.keys() and all(cons[k].shape == one[k].shape for k in cons))
print(f"consolidate: {len(cons)} tensors with whole shapes")
one_more = metrics("tp2one")
print(f"one process from the TP=2 checkpoint: step {one_more[-1]['step']} loss {one_more[-1]['loss']:.4f}")
check("one process continues the TP checkpoint", len(one_more) == 11 and np.isfinite(one_more[-1]["loss"]))
finish()
PY
  ;;
zero)
  CK=(--set checkpoint.every_steps=10)
  train 2 2 dp2 10 "${CK[@]}" 2>dp2.log
  for z in 1 2 3; do
    train 4 2 z$z 10 "${CK[@]}" "${TP[@]}" --set parallel.zero_stage=$z 2>z$z.log
  done
  train 4 2 z3f 10 "${CK[@]}" "${TP[@]}" --set parallel.zero_stage=3 \
    --set activation_checkpointing=full 2>z3f.log
  # An overflow on the last rank only (TP rank 1, DP rank 1): every rank skips step 4.
  train 2 2 dp2o 10 "${CK[@]}" --set "stability.inject_overflow_at=[4]" 2>dp2o.log
  train 4 2 z3o 10 "${CK[@]}" "${TP[@]}" --set parallel.zero_stage=3 \
    --set "stability.inject_overflow_at=[4]" 2>z3o.log
  # fp16 (loss scaling) with an overflow on the last rank: DP=2 x TP=2 ZeRO-3 vs ZeRO-0.
  for z in 0 3; do
    train 4 2 h$z 10 "${CK[@]}" "${TP[@]}" --set parallel.zero_stage=$z --set precision=fp16 \
      --set "stability.inject_overflow_at=[4]" 2>h$z.log
  done
  for run in z1 z2 z3 z3f z3o h0 h3; do
    "$KILN" checkpoint consolidate $run/checkpoints/step-00000010 -o $run.safetensors >/dev/null
  done
  "$KILN" plan "${MODEL[@]}" --set data.micro_batch=2 --world 4 --json >plan4.json
  grep -q "replicated tensors identical on 2 tensor-parallel ranks" z3.log ||
    { echo "no replicated-tensor check in the ZeRO-3 x TP=2 log"; cat z3.log; exit 1; }
  PYTHONPATH="$SRC/tests/python" /usr/bin/python3 - <<'PY'
import json, os
from train_compare import *

for z in (1, 2, 3):
    compare(f"DP=2 x TP=2 ZeRO-{z} vs DP=2 ZeRO-0", "dp2", f"z{z}", grad_norm=True)
compare("DP=2 x TP=2 ZeRO-3, full activation checkpointing vs DP=2 ZeRO-0", "dp2", "z3f")
compare("DP=2 x TP=2 ZeRO-3 vs DP=2 ZeRO-0, overflow injected at step 4 on the last rank",
        "dp2o", "z3o")
compare("DP=2 x TP=2 ZeRO-3 vs ZeRO-0, fp16, overflow injected at step 4", "h0", "h3")
skipped = [[r["step"] for r in metrics(run) if r["skipped"]] for run in ("dp2o", "z3o", "h0", "h3")]
print(f"overflow: skipped steps DP=2 {skipped[0]}, DP=2 x TP=2 ZeRO-3 {skipped[1]}; fp16 "
      f"DP=2 x TP=2 ZeRO-0 {skipped[2]}, ZeRO-3 {skipped[3]}")
check("overflow skipped step 4 on every rank", skipped == [[4]] * 4)

# Bytes: each TP rank's data-parallel group moves 2x (ZeRO-1/2) or 3x (ZeRO-3) the bytes of the
# parameters that TP rank holds (its slices + the replicated tensors, padded per unit), plus the
# tensor-parallel all-reduces; all as kiln plan says.
rows = {z: plan_row("plan4.json", 2, 2, z) for z in (0, 1, 2, 3)}
rows["3f"] = plan_row("plan4.json", 2, 2, 3, "full")
local = rows[0]["comm_bytes_per_step"]["dp.all_reduce"] // 2   # one TP rank's padded fp32 params
for z, factor in ((1, 2), (2, 2), (3, 3), ("3f", 3)):
    run = f"z{z}"
    check(f"{run} trainable", rows[z]["trainable"])
    got = check_comm(run, rows[z], f"DP=2 x TP=2 ZeRO-{z}")
    moved = got["dp.reduce_scatter"] + got["dp.all_gather"]
    print(f"DP=2 x TP=2 ZeRO-{z}: data-parallel {moved} bytes per step = {moved / local:.4f} x "
          f"this TP rank's parameter bytes {local} (formula {factor}x, limit 1%)")
    check(f"ZeRO-{z} x TP {factor}x", abs(moved - factor * local) <= 0.01 * factor * local)
    if z != "3f":
        want, have = planned_states(rows[z]), model_states(f"{run}.log")
        print(f"DP=2 x TP=2 ZeRO-{z}: model states on rank 0 {have} bytes, kiln plan {want} (limit 5%)")
        check(f"ZeRO-{z} x TP model states", abs(have - want) <= 0.05 * want)
peak = buffer_peak("z3.log")
print(f"DP=2 x TP=2 ZeRO-3: gathered weights + gradient buffers peaked at {peak} bytes; kiln "
      f"plan's buffers {rows[3]['bytes_per_rank']['buffers']}")
check("ZeRO-3 x TP buffers", 0 < peak <= rows[3]["bytes_per_rank"]["buffers"])

ck = "z3/checkpoints/step-00000010"
meta = json.load(open(f"{ck}/meta.json"))
files = sorted(f for f in os.listdir(ck) if f.endswith(".safetensors"))
print(f"DP=2 x TP=2 ZeRO-3 checkpoint: {files}")
check("4 shard files", files == meta["files"] and len(files) == 4
      and {k: meta[k] for k in ("world", "dp", "tp", "zero_stage", "partitions", "tp_partitions")}
      == {"world": 4, "dp": 2, "tp": 2, "zero_stage": 3, "partitions": 2, "tp_partitions": 2})
finish()
PY
  ;;
resume)
  train 2 4 ref 10 "${TP[@]}" 2>ref.log
  train 2 4 a 5 --set checkpoint.every_steps=5 "${TP[@]}" 2>a.log
  cp -r a a1
  train 2 4 a 10 --resume "${TP[@]}" 2>>a.log      # same layout: bit-identical
  train 1 4 a1 10 --resume 2>>a1.log               # TP=2 checkpoint on one process
  train 1 4 b 5 --set checkpoint.every_steps=5 2>b.log
  train 2 4 b 10 --resume "${TP[@]}" 2>>b.log      # one-process checkpoint on TP=2
  # DP=2 x TP=2 ZeRO-3 (4 shard files) at step 5: the same layout, DP=1 x TP=2 ZeRO-0, and DP=2
  # ZeRO-1 without TP (reference: the uninterrupted DP=2 x TP=2 ZeRO-3 run).
  Z3=("${TP[@]}" --set parallel.zero_stage=3)
  train 4 2 zref 10 "${Z3[@]}" 2>zref.log
  train 4 2 z 5 --set checkpoint.every_steps=5 "${Z3[@]}" 2>z.log
  cp -r z z1tp
  cp -r z zdp
  train 4 2 z 10 --resume "${Z3[@]}" 2>>z.log
  train 2 4 z1tp 10 --resume "${TP[@]}" 2>>z1tp.log
  train 2 2 zdp 10 --resume --set parallel.zero_stage=1 2>>zdp.log
  grep -q "written with tensor-parallel size 2, resharded to 1" zdp.log ||
    { echo "no TP reshard line"; cat zdp.log; exit 1; }
  # The reverse of consolidate: one file of whole weights as the start of a DP=2 x TP=2 ZeRO-3
  # run (model.init_from). With lr 0 its step-1 checkpoint holds the file's weights bit for bit;
  # a file of another model shape is a config error naming the key (exit 2).
  "$KILN" checkpoint consolidate "zref/checkpoints/$(cat zref/checkpoints/latest)" \
    -o zref.safetensors >/dev/null
  train 4 2 init 1 "${Z3[@]}" --set model.init_from="$PWD/zref.safetensors" \
    --set optimizer.lr=0 --set checkpoint.every_steps=1 2>init.log
  grep -q "model.init_from" init.log || { echo "init_from not logged"; cat init.log; exit 1; }
  "$KILN" checkpoint consolidate init/checkpoints/step-00000001 -o init.safetensors >/dev/null
  set +e
  train 1 4 badinit 1 --set model.init_from="$PWD/zref.safetensors" --set model.d_model=64 \
    >badinit.out 2>&1
  rc=$?
  set -e
  [ "$rc" = 2 ] && grep -q "model.init_from" badinit.out ||
    { echo "init_from of another shape: exit $rc"; cat badinit.out; exit 1; }
  PYTHONPATH="$SRC/tests/python" /usr/bin/python3 - <<'PY'
from train_compare import *
for name, ref, run, tol in (("TP=2 -> TP=2", "ref", "a", 0.0), ("TP=2 -> one process", "ref", "a1", 1e-5),
                            ("one process -> TP=2", "ref", "b", 1e-5),
                            ("DP=2 x TP=2 ZeRO-3 -> the same", "zref", "z", 0.0),
                            ("DP=2 x TP=2 ZeRO-3 -> DP=1 x TP=2 ZeRO-0", "zref", "z1tp", 1e-5),
                            ("DP=2 x TP=2 ZeRO-3 -> DP=2 ZeRO-1 (tp 1)", "zref", "zdp", 1e-5)):
    compare(f"resume {name}", ref, run, tol=tol, steps=range(6, 11), params=False)
d = max_param_diff(tensors("zref.safetensors"), tensors("init.safetensors"), "init_from")
print(f"model.init_from on DP=2 x TP=2 ZeRO-3, lr 0, 1 step: largest weight difference {d:.2e} (limit 0)")
check("model.init_from loads the file's weights", d == 0)
finish()
PY
  ;;
*)
  echo "unknown check $CHECK"
  exit 2
  ;;
esac
rm -rf "$WORK"
