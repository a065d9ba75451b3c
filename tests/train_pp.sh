#!/usr/bin/env bash
# Pipeline-parallel `kiln train` under mpirun (ctest train_pp_*): one check per invocation.
#   train_pp.sh CHECK KILN_BINARY SOURCE_DIR WORK_DIR MPIEXEC
# CHECK:
#   equivalence  a 4-block model, fp32, 10 steps, the same data, seed and global batch (8
#                sequences: one process mb 2 x grad_accum 4): PP=2 and PP=4 (1F1B), PP=2 GPipe,
#                PP=2 with full activation checkpointing, PP=2 x TP=2, PP=2 x DP=2 ZeRO-1, PP=2 x TP=2 x DP=2 (8 ranks, oversubscribed)
#                against one process: losses and gradient norms within 1e-5 relative, final
#                parameters (the consolidated checkpoints) within 1e-5; GPipe's losses equal
#                1F1B's bit for bit; every metrics line has pp_bubble in [0, 1); the run summary
#                prints the formula's bubble; an overflow injected on the last rank only is
#                skipped by every stage at the same step.
#   llama        model.arch llama with model.doc_mask on `kiln prep` data of the default corpus:
#                PP=2 (untied embeddings) against one process, losses within 1e-5; the validation
#                loss per domain (eval.every_steps 5, forward through the stages) within 1e-5 on
#                every rank's metrics (rank 0 is the first stage: it logs the last stage's sums).
#   rollback     a loss spike (an injected learning-rate burst) rolled back to the last checkpoint
#                under PP=2 and PP=2 x DP=2 ZeRO-1 as in one process: one rollback each, to the
#                same step, losses within 1e-5 relative (final parameters within 1e-3: 40 steps
#                at lr 3e-3, see the check).
#   refuse       ZeRO-2 and ZeRO-3 with parallel.pp 2 (exit 2 naming parallel.zero_stage and
#                why), pp * tp not dividing the world (exit 2 naming parallel.pp); grad_accum below
#                pp only warns (bubble).
#   memory       what the first stage (world rank 0, the most micro-batches in flight) allocates
#                through the backend at most, against `kiln plan --json`'s stage 0 total: within
#                10% for PP=2 and PP=4 at m = 4 and 8 under 1F1B and GPipe; under 1F1B it does not
#                grow with m (the in-flight count is the stage count), under GPipe it does.
#   fail         a stage that dies (kill -9 of rank 1 of a PP=2 run): mpirun stops every rank and
#                names it; a stage that stalls (KILN_TEST_STALL, world rank 1 sleeps 120 s at step
#                3) with parallel.collective_timeout_s 2: the job stops itself long before, and
#                rank 0's message names rank 1 (the pipeline message or the step's collective it
#                waits in; tests/comm/comm_p2p_watchdog.sh covers the message's wording).
source "$(dirname "$0")/mpi_train_common.sh"
# 4 blocks (PP=4 needs one per stage); the global batch is 8 sequences everywhere.
MODEL+=(--set model.n_layers=4 --set eval.every_steps=0)
CK=(--set checkpoint.every_steps=0 --set checkpoint.at_end=true)

case "$CHECK" in
equivalence)
  train 1 2 one 10 "${CK[@]}" --set data.grad_accum=4 2>one.log
  train 2 2 pp2 10 "${CK[@]}" --set data.grad_accum=4 --set parallel.pp=2 2>pp2.log
  train 2 2 pp2g 10 "${CK[@]}" --set data.grad_accum=4 --set parallel.pp=2 \
    --set parallel.pp_schedule=gpipe 2>pp2g.log
  train 4 2 pp4 10 "${CK[@]}" --set data.grad_accum=4 --set parallel.pp=4 2>pp4.log
  # Activation checkpointing per stage (each stage's model recomputes its own blocks).
  train 2 2 pp2f 10 "${CK[@]}" --set data.grad_accum=4 --set parallel.pp=2 \
    --set activation_checkpointing=full 2>pp2f.log
  train 4 2 pp2tp2 10 "${CK[@]}" --set data.grad_accum=4 --set parallel.pp=2 --set parallel.tp=2 \
    2>pp2tp2.log
  train 4 2 pp2dp2 10 "${CK[@]}" --set data.grad_accum=2 --set parallel.pp=2 \
    --set parallel.zero_stage=1 2>pp2dp2.log
  train 8 2 pp2tp2dp2 10 "${CK[@]}" --set data.grad_accum=2 --set parallel.pp=2 \
    --set parallel.tp=2 2>pp2tp2dp2.log
  # fp16 with an overflow on the last rank only (a stage of its own): every stage skips step 3.
  train 1 2 one16 6 --set checkpoint.at_end=false --set data.grad_accum=4 --set precision=fp16 \
    --set stability.inject_overflow_at=[3] 2>one16.log
  train 2 2 pp216 6 --set checkpoint.at_end=false --set data.grad_accum=4 --set precision=fp16 \
    --set stability.inject_overflow_at=[3] --set parallel.pp=2 2>pp216.log
  grep -q "pipeline: 2 stages, schedule 1f1b, 4 micro-batches per step; bubble (p-1)/(m+p-1) = 0.200" pp2.log ||
    { echo "no bubble line in the PP=2 log"; cat pp2.log; exit 1; }
  grep -q "pipeline: 4 stages, schedule 1f1b, 4 micro-batches per step; bubble (p-1)/(m+p-1) = 0.429" pp4.log ||
    { echo "no bubble line in the PP=4 log"; cat pp4.log; exit 1; }
  for run in one pp2 pp2g pp2f pp4 pp2tp2 pp2dp2 pp2tp2dp2; do
    ck=$run/checkpoints/$(cat $run/checkpoints/latest)
    "$KILN" checkpoint consolidate "$ck" -o $run.safetensors >/dev/null
  done
  PYTHONPATH="$SRC/tests/python" /usr/bin/python3 - <<'PY'
from train_compare import *

for label, run in (("PP=2 vs one process", "pp2"), ("PP=4 vs one process", "pp4"),
                   ("PP=2 GPipe vs one process", "pp2g"),
                   ("PP=2 full activation checkpointing vs one process", "pp2f"),
                   ("PP=2 x TP=2 vs one process", "pp2tp2"),
                   ("PP=2 x DP=2 ZeRO-1 vs one process", "pp2dp2"),
                   ("PP=2 x TP=2 x DP=2 vs one process", "pp2tp2dp2")):
    compare(label, "one", run, grad_norm=True, fell=True)
a, b = losses("pp2"), losses("pp2g")
print(f"GPipe vs 1F1B at PP=2: {'bit-identical' if a == b else 'DIFFERENT'} losses")
check("GPipe and 1F1B identical", a == b)
for run in ("pp2", "pp2g", "pp4", "pp2tp2", "pp2dp2", "pp2tp2dp2"):
    bub = [r.get("pp_bubble") for r in metrics(run)]
    print(f"{run}: measured pp_bubble per step {['%.3f' % x for x in bub if x is not None]}")
    check(f"{run} pp_bubble on every step in [0, 1)",
          all(x is not None and 0 <= x < 1 for x in bub))
check("one process has no pp_bubble", all("pp_bubble" not in r for r in metrics("one")))
compare("PP=2 fp16 vs one process", "one16", "pp216", tol=1e-4, params=False)
skips = [r["step"] for r in metrics("pp216") if r["skipped"]]
print(f"PP=2 fp16: steps skipped for the overflow on the last rank: {skips} (want [3])")
check("fp16 overflow skip", skips == [3] and metrics("pp216")[2]["skip_reason"] == "overflow")
finish()
PY
  ;;
memory)
  for pp in 2 4; do
    for sch in 1f1b gpipe; do
      for m in 4 8; do
        run=pp$pp-$sch-m$m
        train $pp 2 $run 2 --set checkpoint.at_end=false --set data.grad_accum=$m \
          --set parallel.pp=$pp --set parallel.pp_schedule=$sch >$run.log 2>&1
        grep -o "world rank 0 (.*peak [0-9]* bytes" $run.log >$run.peak ||
          { echo "no peak line in $run.log"; cat $run.log; exit 1; }
        "$KILN" plan "${MODEL[@]}" --set data.micro_batch=2 --set data.grad_accum=$m --world $pp \
          --pp $pp --schedule $sch --json >$run.plan.json
      done
    done
  done
  /usr/bin/python3 - <<'PY'
import json, re
ok = True
peak = {}
for pp in (2, 4):
    for sch in ("1f1b", "gpipe"):
        for m in (4, 8):
            run = f"pp{pp}-{sch}-m{m}"
            line = open(f"{run}.peak").read()
            got = int(re.search(r"peak ([0-9]+) bytes", line).group(1))
            flight = int(re.search(r"([0-9]+) micro-batch", line).group(1))
            rows = [p for p in json.load(open(f"{run}.plan.json"))
                    if p["tp"] == 1 and p["pp"] == pp and p["zero_stage"] == 0
                    and p["activation_checkpointing"] == "none"]
            st = rows[0]["stages"][0]
            want = st["bytes_per_rank"]["total"]
            err = abs(got - want) / want
            peak[pp, sch, m] = got
            print(f"PP={pp} {sch} m={m}: stage 0 keeps {flight} in flight (plan {st['in_flight']}), "
                  f"peak {got} bytes, plan {want} ({100 * err:.2f}% apart)")
            ok &= flight == st["in_flight"] and err <= 0.10
for pp in (2, 4):
    # 1F1B: the activations stay; only the step's staged token batches (a few KiB) grow with m.
    d1 = peak[pp, "1f1b", 8] - peak[pp, "1f1b", 4]
    same = 0 <= d1 <= 0.02 * peak[pp, "1f1b", 4]
    grows = peak[pp, "gpipe", 8] > 1.2 * peak[pp, "gpipe", 4]
    print(f"PP={pp}: 1F1B m=4 -> 8 +{d1} bytes ({'the token batches only' if same else 'GROWS'}); "
          f"GPipe m=4 -> 8 {'grows' if grows else 'DOES NOT GROW'} "
          f"(+{peak[pp, 'gpipe', 8] - peak[pp, 'gpipe', 4]} bytes)")
    ok &= same and grows
raise SystemExit(0 if ok else "memory check failed")
PY
  ;;
llama)
  "$SRC/tools/default_corpus" corpus >/dev/null
  "$KILN" prep --input corpus --output data --threads 2 --set split.val_fraction=0.02 \
    >/dev/null 2>prep.log
  L=(--set data.manifest=data --set model.arch=llama --set model.n_heads=4 --set model.n_kv_heads=2
     --set model.ffn_hidden=96 --set model.doc_mask=true --set model.seq_len=32
     --set model.vocab_size=8192 --set data.grad_accum=4 --set eval.every_steps=5 "${CK[@]}")
  train 1 2 one 10 "${L[@]}" 2>one.log
  train 2 2 pp2 10 "${L[@]}" --set parallel.pp=2 2>pp2.log
  grep -q "document-masked attention" pp2.log || { echo "doc_mask not on"; cat pp2.log; exit 1; }
  for run in one pp2; do
    "$KILN" checkpoint consolidate $run/checkpoints/$(cat $run/checkpoints/latest) \
      -o $run.safetensors >/dev/null
  done
  PYTHONPATH="$SRC/tests/python" /usr/bin/python3 - <<'PY'
from train_compare import *
compare("llama doc_mask PP=2 vs one process", "one", "pp2", grad_norm=True, fell=True)
va = {r["step"]: r["val_loss"] for r in metrics("one") if "val_loss" in r}
vb = {r["step"]: r["val_loss"] for r in metrics("pp2") if "val_loss" in r}
print(f"val_loss steps: one process {sorted(va)}, PP=2 {sorted(vb)}")
check("validation at steps 5 and 10 in both runs", sorted(va) == sorted(vb) == [5, 10])
for step in va:
    check(f"step {step}: the same domains", sorted(va[step]) == sorted(vb.get(step, {})))
    for d, x in va[step].items():
        y = vb[step][d]
        print(f"step {step} {d}: val_loss {x:.8f} / {y:.8f}")
        check(f"val_loss {d} at step {step} within 1e-5", abs(x - y) <= 1e-5 * abs(x))
finish()
PY
  ;;
rollback)
  # A learning-rate burst at step 25 makes a loss spike; stability.spike.action=rollback goes back
  # to the step-20 checkpoint: the loss is the last stage's, summed over the pipeline, so every
  # stage detects the same spike and reloads its own units (PP=2, and PP=2 x DP=2 ZeRO-1 where
  # each rank rereads its shards), as one process does.
  RB=(--set schedule.type=constant --set optimizer.lr=3e-3 --set data.grad_accum=2
      --set checkpoint.every_steps=10 --set stability.spike.warmup_steps=10
      --set stability.spike.window=40 --set stability.spike.z_loss=6 --set stability.spike.z_grad=1000
      --set stability.spike.action=rollback --set 'stability.inject_lr_burst_at=[25]'
      --set stability.lr_burst_factor=300)
  train 1 4 rb 40 "${RB[@]}" 2>rb.log
  train 2 4 rbpp 40 "${RB[@]}" --set parallel.pp=2 2>rbpp.log
  train 4 2 rbz1 40 "${RB[@]}" --set parallel.pp=2 --set parallel.zero_stage=1 2>rbz1.log
  for run in rb rbpp rbz1; do
    "$KILN" checkpoint consolidate "$run/checkpoints/step-00000040" -o "$run.safetensors" >/dev/null
  done
  PYTHONPATH="$SRC/tests/python" /usr/bin/python3 - <<'PY'
import json
from train_compare import *
for run in ("rb", "rbpp", "rbz1"):
    ev = [json.loads(l) for l in open(f"{run}/stability.jsonl")]
    rb = [e for e in ev if e["action"] == "rollback"]
    print(f"{run}: rollbacks {[(e['step'], e['to_step']) for e in rb]}")
    check(f"{run} rolled back once, to the step-20 checkpoint",
          len(rb) == 1 and rb[0]["to_step"] == 20)
# Losses within 1e-5 over the 40 steps. Parameters within 1e-3: at a constant lr 3e-3 for 40
# steps AdamW's normalised update turns the summation-order differences of near-zero gradient
# elements into element differences of ~1e-4 with or without a rollback (PP=2 vs one process
# without the burst: 1.1e-4 measured; the 10-step runs of `equivalence` stay within 1e-5).
for label, run in (("rollback PP=2 vs one process", "rbpp"),
                   ("rollback PP=2 x DP=2 ZeRO-1 vs one process", "rbz1")):
    compare(label, "rb", run, params=False)
    compare(label + " (parameters)", "rb", run, tol=1e-3)
finish()
PY
  ;;
refuse)
  refused() {  # refused NAME NP KEY PATTERN [flags]: exit 2 naming KEY, the message matching PATTERN
    local name=$1 np=$2 key=$3 pattern=$4
    shift 4
    set +e
    train "$np" 2 "$name" 2 "$@" >"$name.out" 2>&1
    local rc=$?
    set -e
    [ "$rc" = 2 ] && grep -q "$key" "$name.out" && grep -qE "$pattern" "$name.out" ||
      { echo "refuse ($name): exit $rc, want 2 naming $key (/$pattern/)"; cat "$name.out"; exit 1; }
    echo "refuse ($name): exit 2: $(grep -m1 "$key" "$name.out")"
  }
  refused z2 2 parallel.zero_stage "ZeRO-2/3 reduce" --set parallel.pp=2 --set parallel.zero_stage=2
  refused z3 4 parallel.zero_stage "once per micro-batch" --set parallel.pp=2 --set parallel.zero_stage=3
  refused ndiv 4 parallel.pp "" --set parallel.pp=3
  # Fewer micro-batches than stages trains (a warning on the bubble).
  train 2 2 few 2 --set parallel.pp=2 --set data.grad_accum=1 --set checkpoint.at_end=false \
    2>few.log
  grep -q "data.grad_accum 1 (micro-batches per step) is below parallel.pp 2" few.log ||
    { echo "refuse: no bubble warning for grad_accum < pp"; cat few.log; exit 1; }
  [ "$(wc -l <few/metrics.jsonl)" = 2 ] || { echo "refuse: grad_accum 1 at pp 2 did not train"; exit 1; }
  ;;
fail)
  # A stage that dies.
  set +e
  train 2 2 kill 1000000 --set parallel.pp=2 --set data.grad_accum=2 \
    --set checkpoint.at_end=false --set checkpoint.every_steps=0 >kill.out 2>&1 &
  MPIRUN=$!
  for _ in $(seq 1 600); do
    [ -s kill/metrics.jsonl ] && [ "$(wc -l <kill/metrics.jsonl)" -ge 3 ] && break
    sleep 0.1
  done
  RANK1=$(rank_pid "$MPIRUN" 1 || true)
  [ -n "$RANK1" ] || { echo "fail: rank 1 not found"; cat kill.out; kill "$MPIRUN"; exit 1; }
  kill -9 "$RANK1"
  for _ in $(seq 1 300); do kill -0 "$MPIRUN" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$MPIRUN" 2>/dev/null; then echo "fail: mpirun still running 30 s after stage 1 died"; kill -9 "$MPIRUN"; exit 1; fi
  wait "$MPIRUN"
  RC=$?
  set -e
  [ "$RC" != 0 ] || { echo "fail: mpirun exited 0 after a stage was killed"; exit 1; }
  grep -q "rank 1" kill.out || { echo "fail: the message does not name rank 1"; cat kill.out; exit 1; }
  echo "fail: stage 1 (rank 1) killed: exit $RC; $(grep -m1 "rank 1" kill.out)"
  # A stage that stalls: its neighbour's receive times out naming it.
  set +e
  KILN_TEST_STALL=1:3:120 timeout 90 "$MPI" -np 2 --oversubscribe "$KILN" train --quiet \
    "${MODEL[@]}" --set data.micro_batch=2 --set data.grad_accum=2 --set run.dir=stall \
    --set run.steps=6 --set parallel.pp=2 --set checkpoint.at_end=false --set checkpoint.every_steps=0 \
    --set parallel.collective_timeout_s=2 >stall.log 2>&1
  RC=$?
  set -e
  [ "$RC" != 0 ] && [ "$RC" != 124 ] ||
    { echo "fail (stall): exit $RC (124: the job hung until the outer timeout)"; cat stall.log; exit 1; }
  # Rank 0 waits for rank 1 in a message of the pipeline or in a collective of the step (where
  # the stall begins): either way its message names rank 1.
  NAMED="rank 0: (point-to-point timeout: (recv|send) #[0-9]+ (from|to) rank 1 \(world rank 1\) on group pp|not arrived: rank 1 )"
  grep -E "timeout|not arrived|peer rank" stall.log | head -4 | sed 's/^/  /'
  grep -qE "$NAMED" stall.log ||
    { echo "fail (stall): rank 0's message does not name the pp message and rank 1"; cat stall.log; exit 1; }
  echo "fail: stage 1 stalled at step 3: exit $RC"
  ;;
*)
  echo "unknown check $CHECK"
  exit 2
  ;;
esac
