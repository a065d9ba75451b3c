#!/usr/bin/env bash
# Data parallelism, ZeRO and tensor parallelism with `device: cuda` under mpirun (ctest
# train_gpu_dist_*): the model's buffers and activations over NCCL, host values over MPI
# (engine/parallel/parallelism.h, engine/parallel/tensor_parallel.h). One check per invocation:
#   train_gpu_dist.sh CHECK KILN_BINARY SOURCE_DIR WORK_DIR MPIEXEC
# CHECK:
#   refuse  (any machine) what cannot run is a config error naming `device` (exit 2) on every
#           rank, never a hang: 2 ranks (data- or tensor-parallel) on a machine without 2 usable
#           GPUs - no GPU, a build without CUDA or NCCL, or (one GPU) "2 ranks on HOST need 2
#           GPUs". Skipped (77) where 2 GPUs exist: nothing to refuse there.
#   nccl    (2+ GPUs; skipped with the reason elsewhere) fp32, 10 steps, the test model:
#           DP=2 on cuda vs one process on cuda with twice the micro-batch: losses within 1e-5
#           relative, final parameters within 1e-4 (NCCL's sums are not in rank order and the
#           GEMMs see other batch shapes); ZeRO-1, -2, -3 on cuda vs ZeRO-0 on cuda: within 1e-5;
#           DP=2 on cuda vs DP=2 on the CPU: losses within 1e-3 absolute (tools/gpu_check's fp32
#           bound); bytes per step == kiln plan (1%); ZeRO-3's model-state bytes == kiln plan
#           (5%); ZeRO-3 stopped at step 5 and resumed on cuda continues within 1e-5; the
#           ZeRO-3 checkpoint written on the GPUs resumes on CPU ranks within 1e-3.
#           Tensor parallelism on cuda: TP=2 vs one process on cuda (the same batch): losses
#           within 1e-5 relative, final parameters within 1e-4 (as DP); TP=2 on cuda vs TP=2 on
#           the CPU: losses within 1e-3 absolute; tp.all_reduce bytes == kiln plan (1%); with 4+
#           GPUs DP=2 x TP=2 ZeRO-3 on cuda vs DP=2 ZeRO-0 on cuda within 1e-5 / 1e-4 (skipped
#           with the reason on 2-3 GPUs).
source "$(dirname "$0")/mpi_train_common.sh"

gpus() {  # the GPUs this process may use (0 without nvidia-smi)
  command -v nvidia-smi >/dev/null 2>&1 || { echo 0; return; }
  local n v
  n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  if [ -n "${CUDA_VISIBLE_DEVICES+x}" ]; then
    v=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c . || true)
    [ "$v" -lt "$n" ] && n=$v
  fi
  echo "$n"
}
NGPU=$(gpus)
CUDA=(--set device=cuda)

# expect_refusal LABEL PATTERN [kiln train flags...]: 2 ranks under mpirun (killed after 120 s:
# a hang fails) exit 2, `device` named, PATTERN in the output.
expect_refusal() {
  local label=$1 pattern=$2
  shift 2
  set +e
  timeout 120 "$MPI" -np 2 --oversubscribe "$KILN" train --quiet "${MODEL[@]}" \
    --set data.micro_batch=2 --set run.dir="$label" --set run.steps=2 "$@" >"$label.out" 2>&1
  local rc=$?
  set -e
  [ "$rc" = 2 ] && grep -q "key 'device'" "$label.out" && grep -Eq "$pattern" "$label.out" ||
    { echo "$label: exit $rc, expected 2 with key 'device' and /$pattern/"; cat "$label.out"; exit 1; }
  echo "$label: exit 2: $(grep -m1 "key 'device'" "$label.out")"
}

case "$CHECK" in
refuse)
  if [ "$NGPU" -ge 2 ]; then
    echo "SKIP: $NGPU GPUs here - 2 ranks on cuda run (train_gpu_dist_nccl checks them)"
    exit 77
  fi
  # 2 ranks, fewer than 2 GPUs: the reason depends on the machine and the build; the same for
  # data and tensor parallelism.
  if [ "$NGPU" = 1 ]; then
    why="2 ranks on .* need 2 GPUs"
  else
    why="no usable GPU|no CUDA device|without CUDA|without it|NCCL"
  fi
  expect_refusal dp2 "$why" "${CUDA[@]}"
  expect_refusal tp2 "$why" "${CUDA[@]}" --set parallel.tp=2
  ;;
nccl)
  if [ "$NGPU" -lt 2 ]; then
    echo "SKIP: needs 2 GPUs (NCCL refuses two ranks on one GPU); this machine has $NGPU"
    exit 77
  fi
  CK=(--set checkpoint.every_steps=10)
  train 1 4 one 10 "${CUDA[@]}" "${CK[@]}" 2>one.log
  train 2 2 dp2 10 "${CUDA[@]}" "${CK[@]}" 2>dp2.log
  train 2 2 cpu2 10 "${CK[@]}" 2>cpu2.log
  for z in 1 2 3; do
    train 2 2 z$z 10 "${CUDA[@]}" "${CK[@]}" --set parallel.zero_stage=$z 2>z$z.log
    "$KILN" checkpoint consolidate z$z/checkpoints/step-00000010 -o z$z.safetensors >/dev/null
  done
  # ZeRO-3 stopped at step 5 and resumed on the GPUs, and on CPU ranks.
  train 2 2 z3r 5 "${CUDA[@]}" --set parallel.zero_stage=3 --set checkpoint.every_steps=5 2>z3r.log
  cp -r z3r z3cpu
  train 2 2 z3r 10 "${CUDA[@]}" --set parallel.zero_stage=3 --set checkpoint.every_steps=10 \
    --resume 2>>z3r.log
  train 2 2 z3cpu 10 --set parallel.zero_stage=3 --set checkpoint.every_steps=10 --resume \
    2>>z3cpu.log
  # Tensor parallelism: TP=2 (the same batch as one process with micro-batch 4), on the GPUs and
  # on CPU ranks.
  train 2 4 tp2 10 "${CUDA[@]}" "${CK[@]}" --set parallel.tp=2 2>tp2.log
  "$KILN" checkpoint consolidate tp2/checkpoints/step-00000010 -o tp2.safetensors >/dev/null
  train 2 4 tp2cpu 10 "${CK[@]}" --set parallel.tp=2 2>tp2cpu.log
  "$KILN" plan "${MODEL[@]}" --set data.micro_batch=4 --world 2 --json >plan-tp.json
  if [ "$NGPU" -ge 4 ]; then  # DP=2 x TP=2 ZeRO-3 on 4 GPUs vs DP=2 ZeRO-0 (dp2 above)
    train 4 2 dp2tp2 10 "${CUDA[@]}" "${CK[@]}" --set parallel.tp=2 --set parallel.zero_stage=3 \
      2>dp2tp2.log
    "$KILN" checkpoint consolidate dp2tp2/checkpoints/step-00000010 -o dp2tp2.safetensors >/dev/null
  else
    echo "DP=2 x TP=2 ZeRO-3 on cuda: skipped, needs 4 GPUs (this machine has $NGPU)"
  fi
  "$KILN" plan "${MODEL[@]}" --set data.micro_batch=2 --world 2 --json >plan.json
  grep -q "gradients over NCCL" dp2.log || { echo "dp2 did not use NCCL"; cat dp2.log; exit 1; }
  grep -q "tensor-parallel activations over NCCL" tp2.log ||
    { echo "tp2 did not use NCCL for its activations"; cat tp2.log; exit 1; }
  PYTHONPATH="$SRC/tests/python" /usr/bin/python3 - <<'PY'
from train_compare import *

compare("DP=2 cuda vs one process cuda", "one", "dp2", tol=1e-4)
compare("DP=2 cuda vs one process cuda (losses)", "one", "dp2", tol=1e-5, params=False)
for z in (1, 2, 3):
    compare(f"ZeRO-{z} cuda vs ZeRO-0 cuda", "dp2", f"z{z}")
a, b = losses("cpu2"), losses("dp2")
worst = max(abs(a[s] - b[s]) for s in a)
print(f"DP=2 cuda vs DP=2 cpu: max |dloss| {worst:.2e} (limit 1e-3)")
check("DP=2 cuda vs cpu", worst <= 1e-3)
check_comm("dp2", plan_row("plan.json", tp=1, dp=2, zero=0))
for z in (1, 2, 3):
    check_comm(f"z{z}", plan_row("plan.json", tp=1, dp=2, zero=z))
got, want = model_states("z3.log"), planned_states(plan_row("plan.json", tp=1, dp=2, zero=3))
print(f"ZeRO-3 model states on rank 0: {got} bytes, kiln plan {want} (limit 5%)")
check("ZeRO-3 model states", abs(got - want) <= 0.05 * want)
compare("ZeRO-3 cuda resumed at 5", "z3", "z3r", steps=range(6, 11), params=False)
c = losses("z3cpu")
worst = max(abs(losses("z3")[s] - c[s]) for s in range(6, 11))
print(f"ZeRO-3 cuda checkpoint resumed on CPU ranks: max |dloss| {worst:.2e} (limit 1e-3)")
check("ZeRO-3 cuda -> cpu resume", worst <= 1e-3)
compare("TP=2 cuda vs one process cuda", "one", "tp2", tol=1e-4)
compare("TP=2 cuda vs one process cuda (losses)", "one", "tp2", tol=1e-5, params=False)
a, b = losses("tp2cpu"), losses("tp2")
worst = max(abs(a[s] - b[s]) for s in a)
print(f"TP=2 cuda vs TP=2 cpu: max |dloss| {worst:.2e} (limit 1e-3)")
check("TP=2 cuda vs cpu", worst <= 1e-3)
check_comm("tp2", plan_row("plan-tp.json", tp=2, dp=1, zero=0), colls=["tp.all_reduce"])
import os
if os.path.exists("dp2tp2.safetensors"):
    compare("DP=2 x TP=2 ZeRO-3 cuda vs DP=2 ZeRO-0 cuda", "dp2", "dp2tp2", tol=1e-4)
    compare("DP=2 x TP=2 ZeRO-3 cuda vs DP=2 ZeRO-0 cuda (losses)", "dp2", "dp2tp2", tol=1e-5,
            params=False)
finish()
PY
  ;;
*)
  echo "unknown check $CHECK"
  exit 2
  ;;
esac
