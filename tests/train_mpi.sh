#!/usr/bin/env bash
# Data-parallel training under mpirun (ctest train_mpi_*): one check per invocation.
#   train_mpi.sh CHECK KILN_BINARY SOURCE_DIR WORK_DIR MPIEXEC
# CHECK:
#   equivalence  DP=2 with micro-batch 2 vs one process with micro-batch 4 (same data, seed and
#                global batch, fp32, 10 steps): losses within 1e-5 relative, final parameters
#                within 1e-5 (absolute, element-wise); the gradient all-reduce moves 2x the (padded) gradient bytes per
#                step, as `kiln plan --json` says, within 1%. DP=2 ZeRO-1 vs DP=2 ZeRO-0: the
#                same bounds; its reduce-scatter + all-gather bytes and its per-rank model-state
#                bytes as `kiln plan` says (bytes within 1%, memory within 5%). `kiln checkpoint
#                consolidate` writes the same weights; a corrupted checkpoint is refused.
#   resume       a run stopped at step 5 on 2 ranks and resumed on 4 (and 4 -> 2, and ZeRO-0 on
#                2 -> ZeRO-1 on 4, ZeRO-1 -> ZeRO-0) continues with the uninterrupted 2-rank
#                run's losses within fp32 round-off (1e-5 relative); on the same layout the
#                resumed losses are bit-identical.
#   zero         DP=2 ZeRO-2 and ZeRO-3 (prefetch 1 and 2, full activation checkpointing, 2
#                micro-batches per step, bf16) vs DP=2 ZeRO-0 with the same settings: losses and
#                final parameters within 1e-5 (fp32; bit-identical where the sums are the same);
#                bytes per step as `kiln plan` says within 1% (ZeRO-2: reduce-scatter + all-gather
#                = 2x the parameter bytes; ZeRO-3: 3x); per-rank model-state bytes as `kiln plan`
#                says within 5%, ZeRO-3's within 5% of ZeRO-0's / 2, the measured peak of gathered
#                weights and gradient buffers within the plan's stated buffers; resume ZeRO-1 ->
#                ZeRO-3 and ZeRO-3 -> ZeRO-1 continue the uninterrupted run within 1e-5; an injected
#                overflow skips the same step under ZeRO-3 as under ZeRO-0; per-rank shard files
#                resume bit-identically on the same layout and reshard from 2 to 4 ranks.
#   kill         kill -9 of rank 0 while it writes checkpoints (one per step; ZeRO-0, where rank 0
#                writes, and ZeRO-3, where every rank writes its shard): mpirun stops every
#                rank and names the rank; --resume continues from the last complete checkpoint
#                and finishes the run.
#   signal       SIGUSR1 to rank 1 only (as a scheduler's warning may reach one process): every
#                rank stops after the same step, the checkpoint of that step is complete, mpirun
#                exits 0, and --resume continues from it.
#   hang         a rank that stops arriving (KILN_TEST_STALL, a test-only hook: world rank 1 sleeps
#                120 s at step 3 before its collectives) with parallel.collective_timeout_s 2: the
#                job exits non-zero long before the stall ends (not a hang: an outer timeout of
#                90 s would give 124), and rank 0's message names itself, the collective and its
#                group, the step, and rank 1 as not arrived; the same on DP=2 x TP=2 ZeRO-3 with
#                rank 3 stalled (ZeRO-3's asynchronous gathers); `kiln prep` on 2 ranks with
#                rank 1 stalled before its first collective (--collective-timeout 2) likewise.
#                Without a stall, runs with the watchdog off (0) and on are bit-identical.
#   rollback     a loss spike (an injected learning-rate burst) rolled back to the last checkpoint
#                under DP=2 ZeRO-1 and ZeRO-3 (each rank rereads its shards) as under ZeRO-0: one
#                rollback each, to the same step, the same losses and final parameters (1e-5).
#   startup      the model states are built sharded (engine/parallel/zero.h create): for a model whose
#                states dominate (74 MB in one process), DP=2 ZeRO-3 rank 0's start-up peak
#                through the backend is 1/2 of one process's (within 5%) and equals `kiln plan`'s
#                `startup` (within 1%; also bf16 ZeRO-1), its peak RSS at start-up is lower by at
#                least 80% of the half it does not hold; resuming (same layout, 1 -> 2 ZeRO-3,
#                2 ZeRO-3 -> 1) has the same peaks (each rank reads its byte ranges).
source "$(dirname "$0")/mpi_train_common.sh"

case "$CHECK" in
equivalence)
  train 1 4 one 10 --set checkpoint.every_steps=10 2>one.log
  train 2 2 dp2 10 --set checkpoint.every_steps=10 2>dp2.log
  train 2 2 z1 10 --set checkpoint.every_steps=10 --set parallel.zero_stage=1 2>z1.log
  "$KILN" plan "${MODEL[@]}" --set data.micro_batch=2 --world 2 --json >plan.json
  # One file a single process can load, from the ZeRO-1 run's checkpoint (z1.safetensors: the
  # comparisons read a run's weights there, tests/python/train_compare.py); a corrupted checkpoint
  # is refused (exit 3, the file named) and writes nothing.
  "$KILN" checkpoint consolidate z1/checkpoints/step-00000010 -o z1.safetensors >/dev/null
  "$KILN" checkpoint consolidate dp2/checkpoints/step-00000010 -o dp2-consolidated.safetensors >/dev/null
  cp -r z1/checkpoints/step-00000010 broken
  printf 'x' | dd of=broken/shard-00001-of-00002.safetensors bs=1 seek=200 conv=notrunc 2>/dev/null
  set +e
  "$KILN" checkpoint consolidate broken -o broken.safetensors 2>broken.err
  rc=$?
  set -e
  [ "$rc" = 3 ] && grep -q "checksum mismatch" broken.err && [ ! -e broken.safetensors ] ||
    { echo "consolidate: a corrupted checkpoint gave exit $rc"; cat broken.err; exit 1; }
  PYTHONPATH="$SRC/tests/python" /usr/bin/python3 - <<'PY'
import json, os
import numpy as np
from train_compare import *

compare("DP=2 vs one process", "one", "dp2")
# Beside the element-wise bound: the whole model's relative difference |p1 - p2| / |p1|.
t1, t2 = tensors("one"), tensors("dp2")
d2 = sum(float(np.sum((t1[k] - t2[k]).astype(np.float64) ** 2)) for k in t1)
n2 = sum(float(np.sum(t1[k].astype(np.float64) ** 2)) for k in t1)
print(f"DP=2 vs one process: whole-model relative parameter difference {(d2 / n2) ** 0.5:.2e}")
# ZeRO-1's checkpoint holds per-rank shards: its weights come from `kiln checkpoint consolidate`.
compare("DP=2 ZeRO-1 vs DP=2 ZeRO-0", "dp2", "z1")
# ZeRO-0 (replicated: rank 0 writes model.safetensors) consolidates to the same file contents.
z0t, cons = tensors("dp2"), tensors("dp2-consolidated.safetensors")
same = cons.keys() == z0t.keys() and all(np.array_equal(cons[k], z0t[k]) for k in cons)
print(f"consolidate: {len(cons)} tensors, identical to the checkpoint's weights: {same}")
check("consolidate of a replicated checkpoint", same)
# The ZeRO-1 checkpoint: one file per rank and meta.json recording the layout.
ck = "z1/checkpoints/step-00000010"
meta = json.load(open(f"{ck}/meta.json"))
files = sorted(f for f in os.listdir(ck) if f.startswith("shard-"))
lay = {k: meta[k] for k in ("world", "dp", "tp", "zero_stage", "partitions", "precision")}
print(f"ZeRO-1 checkpoint: {files}, meta.json {lay}")
check("ZeRO-1 checkpoint layout",
      files == ["shard-00000-of-00002.safetensors", "shard-00001-of-00002.safetensors"]
      and lay == {"world": 2, "dp": 2, "tp": 1, "zero_stage": 1, "partitions": 2, "precision": "fp32"}
      and [t["name"] for t in meta["tensors"]] == list(z0t.keys())
      and all(t["shape"] == list(z0t[t["name"]].shape) for t in meta["tensors"]))
check_comm("dp2", plan_row("plan.json", 1, 2, 0), colls=["dp.all_reduce"])
z1row = plan_row("plan.json", 1, 2, 1)
check_comm("z1", z1row, "ZeRO-1")
want, got = planned_states(z1row), model_states("z1.log")
print(f"ZeRO-1: model states on rank 0 {got} bytes, kiln plan {want} (limit 5%); "
      f"ZeRO-0 {planned_states(plan_row('plan.json', 1, 2, 0))}")
check("ZeRO-1 model states", abs(got - want) <= 0.05 * want)
finish()
PY
  ;;
resume)
  train 2 2 ref 10 2>ref.log
  train 2 2 a 5 --set checkpoint.every_steps=5 2>a.log
  cp -r a a4
  cp -r a az
  train 2 2 a 10 --resume 2>>a.log            # same layout: bit-identical
  train 4 1 az 10 --resume --set parallel.zero_stage=1 2>>az.log   # ZeRO-0 on 2 -> ZeRO-1 on 4
  train 2 2 c 5 --set checkpoint.every_steps=5 --set parallel.zero_stage=1 2>c.log
  train 2 2 c 10 --resume 2>>c.log            # ZeRO-1 -> ZeRO-0
  train 4 1 a4 10 --resume 2>>a4.log          # written on 2 ranks, resumed on 4
  train 4 1 b 5 --set checkpoint.every_steps=5 2>b.log
  train 2 2 b 10 --resume 2>>b.log            # written on 4 ranks, resumed on 2
  PYTHONPATH="$SRC/tests/python" /usr/bin/python3 - <<'PY'
from train_compare import *
for name, run, tol in (("2 -> 2", "a", 0.0), ("2 -> 4", "a4", 1e-5), ("4 -> 2", "b", 1e-5),
                       ("2 ZeRO-0 -> 4 ZeRO-1", "az", 1e-5), ("2 ZeRO-1 -> 2 ZeRO-0", "c", 1e-5)):
    compare(f"resume {name} ranks", "ref", run, tol=tol, steps=range(6, 11), params=False)
finish()
PY
  ;;
zero)
  train 2 2 z0 10 --set checkpoint.every_steps=10 2>z0.log
  train 2 2 z2 10 --set checkpoint.every_steps=10 --set parallel.zero_stage=2 2>z2.log
  train 2 2 z3 10 --set checkpoint.every_steps=10 --set parallel.zero_stage=3 2>z3.log
  train 2 2 z3p2 10 --set checkpoint.every_steps=10 --set parallel.zero_stage=3 \
    --set parallel.prefetch=2 --set activation_checkpointing=full 2>z3p2.log
  train 2 1 z0a 10 --set checkpoint.every_steps=10 --set data.grad_accum=2 2>z0a.log
  train 2 1 z3a 10 --set checkpoint.every_steps=10 --set data.grad_accum=2 \
    --set parallel.zero_stage=3 2>z3a.log
  train 2 2 z0b 10 --set checkpoint.every_steps=10 --set precision=bf16 2>z0b.log
  train 2 2 z3b 10 --set checkpoint.every_steps=10 --set precision=bf16 \
    --set parallel.zero_stage=3 2>z3b.log
  for z in 1 2; do
    train 2 2 z${z}b 10 --set checkpoint.every_steps=10 --set precision=bf16 \
      --set parallel.zero_stage=$z 2>z${z}b.log
  done
  # An overflow at step 4 (injected into the gradients): every rank skips the same step.
  train 2 2 z0o 10 --set checkpoint.every_steps=10 --set "stability.inject_overflow_at=[4]" 2>z0o.log
  train 2 2 z3o 10 --set checkpoint.every_steps=10 --set "stability.inject_overflow_at=[4]" \
    --set parallel.zero_stage=3 2>z3o.log
  # Resharding resume: ZeRO-1 -> ZeRO-3 and ZeRO-3 -> ZeRO-1 at step 5 (reference: z0).
  train 2 2 r13 5 --set checkpoint.every_steps=5 --set parallel.zero_stage=1 2>r13.log
  train 2 2 r13 10 --resume --set checkpoint.every_steps=10 --set parallel.zero_stage=3 2>>r13.log
  train 2 2 r31 5 --set checkpoint.every_steps=5 --set parallel.zero_stage=3 2>r31.log
  cp -r r31 r33
  cp -r r31 r34
  cp r31.log r33.log
  cp r31.log r34.log
  train 2 2 r31 10 --resume --set checkpoint.every_steps=10 --set parallel.zero_stage=1 2>>r31.log
  # Same layout (ZeRO-3 on 2, per-rank shards): bit-identical; 2 -> 4 ranks reshards.
  train 2 2 r33 10 --resume --set checkpoint.every_steps=10 --set parallel.zero_stage=3 2>>r33.log
  train 4 1 r34 10 --resume --set checkpoint.every_steps=10 --set parallel.zero_stage=3 2>>r34.log
  for run in z0 z2 z3 z3p2 z0a z3a z0b z1b z2b z3b z0o z3o r13 r31 r33 r34; do
    [ -d "$run/checkpoints/step-00000010" ] || continue
    "$KILN" checkpoint consolidate "$run/checkpoints/step-00000010" -o "$run.safetensors" >/dev/null
  done
  "$KILN" plan "${MODEL[@]}" --set data.micro_batch=2 --world 2 --json >plan.json
  "$KILN" plan "${MODEL[@]}" --set data.micro_batch=2 --set precision=bf16 --world 2 --json >plan-bf16.json
  PYTHONPATH="$SRC/tests/python" /usr/bin/python3 - <<'PY'
from train_compare import *

compare("DP=2 ZeRO-2 vs ZeRO-0", "z0", "z2")
compare("DP=2 ZeRO-3 vs ZeRO-0", "z0", "z3")
compare("DP=2 ZeRO-3 prefetch 2, full recompute vs ZeRO-0", "z0", "z3p2")
compare("DP=2 ZeRO-3 vs ZeRO-0, 2 micro-batches per step", "z0a", "z3a")
# bf16: the same rounding on both sides (the working copy is rounded from the same fp32 master
# shard by the same AdamW kernel), so the bound is the fp32 one.
compare("DP=2 ZeRO-3 vs ZeRO-0, bf16", "z0b", "z3b")
compare("DP=2 ZeRO-1 vs ZeRO-0, bf16", "z0b", "z1b")
compare("DP=2 ZeRO-2 vs ZeRO-0, bf16", "z0b", "z2b")
compare("DP=2 ZeRO-3 vs ZeRO-0, overflow injected at step 4", "z0o", "z3o")
skipped = [[r["step"] for r in metrics(run) if r["skipped"]] for run in ("z0o", "z3o")]
print(f"overflow: skipped steps ZeRO-0 {skipped[0]}, ZeRO-3 {skipped[1]}")
check("overflow skipped step 4 in both", skipped == [[4], [4]])
compare("resume ZeRO-1 -> ZeRO-3 at step 5", "z0", "r13", steps=range(6, 11))
compare("resume ZeRO-3 -> ZeRO-1 at step 5", "z0", "r31", steps=range(6, 11))
compare("resume ZeRO-3 on 2 ranks -> ZeRO-3 on 2 ranks at step 5", "z3", "r33", tol=0.0,
        steps=range(6, 11))
compare("resume ZeRO-3 on 2 ranks -> ZeRO-3 on 4 ranks at step 5", "z0", "r34",
        steps=range(6, 11))

param_bytes = plan_row("plan.json", 1, 2, 0)["comm_bytes_per_step"]["dp.all_reduce"] // 2
for z, run, factor in ((2, "z2", 2), (3, "z3", 3)):
    row = plan_row("plan.json", 1, 2, z)
    got = check_comm(run, row, f"ZeRO-{z}")
    moved = got["dp.reduce_scatter"] + got["dp.all_gather"]
    print(f"ZeRO-{z}: {moved} bytes per step = {moved / param_bytes:.4f} x the parameter bytes "
          f"{param_bytes} (formula {factor}x, limit 1%)")
    check(f"ZeRO-{z} {factor}x", abs(moved - factor * param_bytes) <= 0.01 * factor * param_bytes)
    want, have = planned_states(row), model_states(f"{run}.log")
    print(f"ZeRO-{z}: model states on rank 0 {have} bytes, kiln plan {want} (limit 5%)")
    check(f"ZeRO-{z} model states", abs(have - want) <= 0.05 * want)
    peak, buffers = buffer_peak(f"{run}.log"), row["bytes_per_rank"]["buffers"]
    print(f"ZeRO-{z}: gathered weights + gradient buffers peaked at {peak} bytes; kiln plan's "
          f"buffers {buffers} (the peak must not exceed them)")
    check(f"ZeRO-{z} buffers", 0 < peak <= buffers)
# bf16: the fp32 master weights are sharded optimizer state at every stage (18 bytes per
# parameter at ZeRO-0: bf16 weights, fp32 gradients, master and two moments).
for z in (1, 2, 3):
    want, have = planned_states(plan_row("plan-bf16.json", 1, 2, z)), model_states(f"z{z}b.log")
    print(f"ZeRO-{z} bf16: model states on rank 0 {have} bytes, kiln plan {want} (limit 5%)")
    check(f"ZeRO-{z} bf16 model states", abs(have - want) <= 0.05 * want)
z0_states, z3_states = planned_states(plan_row("plan.json", 1, 2, 0)), model_states("z3.log")
print(f"ZeRO-3 model states {z3_states} bytes vs ZeRO-0's / 2 = {z0_states / 2:.0f} "
      f"(ratio {z3_states / (z0_states / 2):.4f}, limit 5%)")
check("ZeRO-3 = ZeRO-0 / dp", abs(z3_states - z0_states / 2) <= 0.05 * z0_states / 2)
finish()
PY
  ;;
signal)
  set +e
  train 2 2 run 100000 --set checkpoint.every_steps=0 >signal.out 2>&1 &
  MPIRUN=$!
  for _ in $(seq 1 600); do
    [ "$(wc -l <run/metrics.jsonl 2>/dev/null || echo 0)" -ge 2 ] && break
    sleep 0.1
  done
  RANK1=$(rank_pid "$MPIRUN" 1 || true)
  [ -n "$RANK1" ] || { echo "signal: rank 1 not found"; cat signal.out; kill "$MPIRUN"; exit 1; }
  kill -USR1 "$RANK1"
  for _ in $(seq 1 600); do kill -0 "$MPIRUN" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$MPIRUN" 2>/dev/null; then echo "signal: still running 60 s after SIGUSR1"; kill -9 "$MPIRUN"; exit 1; fi
  wait "$MPIRUN"
  RC=$?
  set -e
  [ "$RC" = 0 ] || { echo "signal: mpirun exited $RC"; cat signal.out; exit 1; }
  grep -q "stopped by SIGUSR1" signal.out || { echo "signal: no stop message"; cat signal.out; exit 1; }
  STEPS=$(wc -l <run/metrics.jsonl)
  LATEST=$(cat run/checkpoints/latest)
  [ "$LATEST" = "$(printf 'step-%08d' "$STEPS")" ] ||
    { echo "signal: latest $LATEST but $STEPS metrics lines"; cat signal.out; exit 1; }
  echo "signal: both ranks stopped after step $STEPS; checkpoint $LATEST complete"
  TARGET=$(( STEPS + 2 ))
  train 2 2 run "$TARGET" --resume --set checkpoint.every_steps=0 2>resume.log ||
    { cat resume.log; exit 1; }
  [ "$(wc -l <run/metrics.jsonl)" = "$TARGET" ] || { echo "signal: resume did not reach $TARGET"; exit 1; }
  ;;
kill)
  for Z in 0 3; do  # ZeRO-0: rank 0 writes; ZeRO-3: every rank writes its shard
  rm -rf run
  # Every step writes a checkpoint, so most of the time rank 0 is inside a checkpoint write. The
  # run is far longer than the test (it is killed): 400 steps of this model took under a second on
  # a quiet machine, so rank 0 could be gone before it was looked for ("rank 0 not found").
  set +e
  train 2 2 run 1000000 --set checkpoint.every_steps=1 --set checkpoint.keep_last=2 \
    --set parallel.zero_stage=$Z >kill.out 2>&1 &
  MPIRUN=$!
  # Wait until 4 checkpoints are complete. `latest` names the newest one; the step-N directories
  # themselves last only keep_last steps (a few ms on a quiet machine: a poll can miss them).
  for _ in $(seq 1 600); do
    L=$(cat run/checkpoints/latest 2>/dev/null || true)
    [[ "$L" =~ ^step-([0-9]+)$ ]] && [ $((10#${BASH_REMATCH[1]})) -ge 4 ] && break
    sleep 0.1
  done
  RANK0=$(rank_pid "$MPIRUN" 0 || true)
  [ -n "$RANK0" ] || { echo "kill: rank 0 not found"; cat kill.out; kill "$MPIRUN"; exit 1; }
  kill -9 "$RANK0" || { echo "kill: could not kill rank 0 ($RANK0)"; exit 1; }
  # mpirun must stop every rank (not hang) and say which one died.
  for _ in $(seq 1 300); do kill -0 "$MPIRUN" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$MPIRUN" 2>/dev/null; then echo "kill: mpirun still running 30 s after rank 0 died"; kill -9 "$MPIRUN"; exit 1; fi
  wait "$MPIRUN"
  RC=$?
  set -e
  [ "$RC" != 0 ] || { echo "kill: mpirun exited 0 after a rank was killed"; exit 1; }
  grep -q "rank 0" kill.out || { echo "kill: mpirun's message does not name rank 0"; cat kill.out; exit 1; }
  LATEST=$(cat run/checkpoints/latest)
  echo "kill (ZeRO-$Z): rank 0 killed; latest complete checkpoint $LATEST"
  # Resume past the checkpoint wherever the kill landed (on a quiet machine rank 0 may already be
  # dozens of steps in): four more steps than the latest complete checkpoint.
  TARGET=$(( 10#${LATEST#step-} + 4 ))
  train 2 2 run "$TARGET" --resume --set checkpoint.every_steps=0 --set parallel.zero_stage=$Z 2>resume.log ||
    { cat resume.log; exit 1; }
  grep -q "resumed from" resume.log || { echo "kill: no resume line"; cat resume.log; exit 1; }
  TARGET="$TARGET" /usr/bin/python3 - <<'PY'
import json, os, sys
target = int(os.environ["TARGET"])
steps = [json.loads(l)["step"] for l in open("run/metrics.jsonl")]
print(f"kill: after resume metrics hold steps {steps[0]}..{steps[-1]} ({len(steps)} lines), expected 1..{target}")
sys.exit(0 if steps == list(range(1, target + 1)) else 1)
PY
  done
  ;;
hang)
  stalled() {  # stalled NAME STALL NP [extra flags]: a run that must stop itself, its rc in RC
    local name=$1 stall=$2 np=$3
    shift 3
    set +e
    KILN_TEST_STALL=$stall timeout 90 "$MPI" -np "$np" --oversubscribe "$KILN" train --quiet \
      "${MODEL[@]}" --set data.micro_batch=2 --set run.dir="$name" --set run.steps=6 \
      --set parallel.collective_timeout_s=2 "$@" >"$name.log" 2>&1
    RC=$?
    set -e
    [ "$RC" != 0 ] && [ "$RC" != 124 ] ||
      { echo "hang ($name): exit $RC (124: the job hung until the outer timeout)"; exit 1; }
  }
  expect() {  # expect LOG PATTERN WHAT
    grep -qE "$2" "$1" || { echo "hang: $1 lacks $3 (/$2/)"; exit 1; }
  }
  stalled dp2 1:3:120 2
  expect dp2.log "rank 0: collective timeout: [a-z_]+ #[0-9]+ on group [a-z]+ \(mpi, rank 0 of 2\) has not completed after [0-9.]+ s \(parallel.collective_timeout_s 2\); this rank is at step 3" "the timed-out collective"
  expect dp2.log "rank 0: not arrived: rank 1 \(it has started [0-9]+ collectives on [a-z]+, this is #[0-9]+\): at step 3; in no collective" "rank 1 as not arrived"
  expect dp2.log "ranks not arrived or not answering: 1; arrived: none" "the summary"
  grep -E "collective timeout|not arrived" dp2.log | sed 's/^/  /'
  echo "hang: DP=2, rank 1 stalled at step 3: exit $RC"
  stalled tp 3:2:120 4 --set parallel.tp=2 --set parallel.zero_stage=3
  # The first rank to time out aborts the job, so the others may be stopped before they log:
  # at least one must name rank 3, and none may name another rank.
  expect tp.log "rank [012]: not arrived: rank 3 .*: at step 2" "a rank naming rank 3"
  if grep -qE "not arrived: rank [012] " tp.log; then
    echo "hang: tp.log names a rank other than the stalled rank 3:"
    grep -E "not arrived" tp.log
    exit 1
  fi
  echo "hang: DP=2 x TP=2 ZeRO-3, rank 3 stalled at step 2: exit $RC"
  # kiln prep under mpirun: rank 1 stalls before the first collective.
  mkdir -p prep-in
  for i in $(seq 1 30); do echo "{\"text\": \"document $i about $((i * 7)) things\"}"; done >prep-in/a.jsonl
  set +e
  KILN_TEST_STALL=1:0:120 timeout 90 "$MPI" -np 2 --oversubscribe "$KILN" prep --input prep-in \
    --output prep-out --collective-timeout 2 >prep.log 2>&1
  RC=$?
  set -e
  [ "$RC" != 0 ] && [ "$RC" != 124 ] ||
    { echo "hang (kiln prep): exit $RC (124: the job hung until the outer timeout)"; exit 1; }
  expect prep.log "rank 0: collective timeout: .* \(--collective-timeout 2\); this rank is at kiln prep" "prep's timed-out collective"
  expect prep.log "rank 0: not arrived: rank 1 .*: at kiln prep" "prep naming rank 1"
  grep -E "collective timeout|not arrived" prep.log | sed 's/^/  /'
  echo "hang: kiln prep on 2 ranks, rank 1 stalled: exit $RC"
  train 2 2 on 4 2>on.log
  train 2 2 off 4 --set parallel.collective_timeout_s=0 2>off.log
  PYTHONPATH="$SRC/tests/python" /usr/bin/python3 - <<'PY'
from train_compare import *
worst, adiff = compare("watchdog off vs on", "on", "off", tol=0.0)
finish()
PY
  ;;
rollback)
  # A learning-rate burst at step 25 makes a loss spike; stability.spike.action=rollback goes
  # back to the step-20 checkpoint. Under ZeRO each rank reads its shards' ranges of it again
  # (ZeroOptimizer::reload), so ZeRO-1 and ZeRO-3 roll back exactly as ZeRO-0 does.
  RB=(--set schedule.type=constant --set optimizer.lr=3e-3 --set eval.every_steps=0
      --set checkpoint.every_steps=10 --set stability.spike.warmup_steps=10
      --set stability.spike.window=40 --set stability.spike.z_loss=6 --set stability.spike.z_grad=1000
      --set stability.spike.action=rollback --set 'stability.inject_lr_burst_at=[25]'
      --set stability.lr_burst_factor=300)
  train 2 2 rb0 40 "${RB[@]}" 2>rb0.log
  train 2 2 rb1 40 "${RB[@]}" --set parallel.zero_stage=1 2>rb1.log
  train 2 2 rb3 40 "${RB[@]}" --set parallel.zero_stage=3 2>rb3.log
  for run in rb1 rb3; do  # per-rank shards: the weights of one file
    "$KILN" checkpoint consolidate "$run/checkpoints/step-00000040" -o "$run.safetensors" >/dev/null
  done
  PYTHONPATH="$SRC/tests/python" /usr/bin/python3 - <<'PY'
import json
from train_compare import *
for run in ("rb0", "rb1", "rb3"):
    ev = [json.loads(l) for l in open(f"{run}/stability.jsonl")]
    rb = [e for e in ev if e["action"] == "rollback"]
    print(f"{run}: rollbacks {[(e['step'], e['to_step']) for e in rb]}")
    check(f"{run} rolled back once, to the step-20 checkpoint",
          len(rb) == 1 and rb[0]["to_step"] == 20)
compare("rollback: DP=2 ZeRO-1 vs ZeRO-0", "rb0", "rb1")
compare("rollback: DP=2 ZeRO-3 vs ZeRO-0", "rb0", "rb3")
finish()
PY
  ;;
startup)
  # A model whose states dwarf everything else a rank holds at start-up: vocabulary 32768 x
  # d_model 128, 4.6M parameters, 74 MB of fp32 model states in one process.
  BIG=(--set model.vocab_size=32768 --set model.d_model=128 --set checkpoint.every_steps=2
       --set checkpoint.keep_last=1)
  one() {  # one RUN_DIR STEPS [extra...]: DP=1 under mpirun -np 1 (the same MPI start-up as
    # the 2-rank runs, so their peak RSS compares)
    local dir=$1 steps=$2
    shift 2
    "$MPI" -np 1 "$KILN" train --quiet "${MODEL[@]}" "${BIG[@]}" --set data.micro_batch=2 \
      --set run.dir="$dir" --set run.steps="$steps" "$@"
  }
  "$KILN" plan "${MODEL[@]}" "${BIG[@]}" --set data.micro_batch=1 --world 2 --json >plan.json
  "$KILN" plan "${MODEL[@]}" "${BIG[@]}" --set data.micro_batch=2 --world 1 --json >plan1.json
  "$KILN" plan "${MODEL[@]}" "${BIG[@]}" --set data.micro_batch=1 --set precision=bf16 \
    --world 2 --json >plan-bf16.json
  one one 2 2>one.log
  train 2 1 z3 2 "${BIG[@]}" --set parallel.zero_stage=3 2>z3.log
  train 2 1 z1b 1 "${BIG[@]}" --set parallel.zero_stage=1 --set precision=bf16 2>z1b.log
  cp -r one one-z3
  cp -r z3 z3-one
  one one 3 --resume 2>one-r.log                                          # ZeRO-0 -> ZeRO-0
  train 2 1 z3 3 "${BIG[@]}" --set parallel.zero_stage=3 --resume 2>z3-r.log   # 2 ZeRO-3 -> same
  train 2 1 one-z3 3 "${BIG[@]}" --set parallel.zero_stage=3 --resume 2>one-z3.log  # 1 -> 2 ZeRO-3
  one z3-one 3 --resume 2>z3-one.log                                      # 2 ZeRO-3 -> 1
  PYTHONPATH="$SRC/tests/python" /usr/bin/python3 - <<'PY'
import re
from train_compare import *

def startup(log):
    """rank 0's 'model states from ...: N bytes held; start-up peak P bytes ...; peak RSS R MiB'."""
    m = re.search(r"model states from (\S+).*?: (\d+) bytes held; start-up peak (\d+) bytes.*?"
                  r"peak RSS ([\d.]+) MiB", open(log).read())
    check(f"{log} reports its start-up peak", m is not None)
    return {"from": m.group(1), "held": int(m.group(2)), "peak": int(m.group(3)),
            "rss": float(m.group(4)) * 1048576}

one, z3, z1b = startup("one.log"), startup("z3.log"), startup("z1b.log")
p1 = plan_row("plan1.json", 1, 1, 0)["bytes_per_rank"]["startup"]
p3 = plan_row("plan.json", 1, 2, 3)["bytes_per_rank"]["startup"]
p1b = plan_row("plan-bf16.json", 1, 2, 1)["bytes_per_rank"]["startup"]
for name, got, want in (("DP=1 ZeRO-0", one, p1), ("DP=2 ZeRO-3", z3, p3),
                        ("DP=2 ZeRO-1 bf16", z1b, p1b)):
    print(f"{name} start-up: peak {got['peak']} bytes through the backend ({got['held']} held "
          f"after), kiln plan {want} (limit 1%); peak RSS {got['rss'] / 1048576:.1f} MiB")
    check(f"{name} start-up peak == kiln plan", abs(got["peak"] - want) <= 0.01 * want)
ratio = z3["peak"] / one["peak"]
print(f"ZeRO-3 start-up peak / DP=1's = {ratio:.4f} (1/DP = 0.5, limit 5%)")
check("ZeRO-3 start-up peak is 1/DP of one process's", abs(ratio - 0.5) <= 0.025)
# The process as a whole: the ZeRO-3 rank's RSS at start-up is below one process's by at least
# 80% of the half of the model states it does not hold (same MPI start-up, same libraries).
saved = one["rss"] - z3["rss"]
print(f"peak RSS at start-up: DP=1 {one['rss'] / 1048576:.1f} MiB, DP=2 ZeRO-3 rank 0 "
      f"{z3['rss'] / 1048576:.1f} MiB: {saved / 1048576:.1f} MiB less (half the model states: "
      f"{one['peak'] / 2 / 1048576:.1f} MiB; at least 80% of it)")
check("ZeRO-3 start-up RSS", saved >= 0.8 * one["peak"] / 2)
# Resume: the same peaks from the checkpoints, whatever layout wrote them (ranges of the files).
for name, log, ref in (("DP=1 -> DP=1", "one-r.log", one), ("DP=2 ZeRO-3 -> same", "z3-r.log", z3),
                       ("DP=1 ZeRO-0 -> DP=2 ZeRO-3", "one-z3.log", z3),
                       ("DP=2 ZeRO-3 -> DP=1", "z3-one.log", one)):
    r = startup(log)
    print(f"resume {name}: from {r['from']}, peak {r['peak']} bytes (start-up {ref['peak']}), "
          f"peak RSS {r['rss'] / 1048576:.1f} MiB (start-up {ref['rss'] / 1048576:.1f})")
    check(f"resume {name} read a checkpoint", "checkpoints/step-" in r["from"])
    check(f"resume {name} peak == start-up peak", r["peak"] == ref["peak"])
    check(f"resume {name} RSS within 8 MiB of start-up's", r["rss"] <= ref["rss"] + 8 * 1048576)
compare("resume 2 ZeRO-3 -> 2 ZeRO-3 vs DP=1 -> 2 ZeRO-3 (same states)", "z3", "one-z3",
        tol=1e-5, steps=range(3, 4), params=False)
finish()
PY
  ;;
*)
  echo "unknown check $CHECK"
  exit 2
  ;;
esac
rm -rf "$WORK"
