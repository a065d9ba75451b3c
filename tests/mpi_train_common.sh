# Shared by the mpirun training checks (tests/train_mpi.sh, tests/train_tp.sh): sourced with the
# check's arguments CHECK KILN_BINARY SOURCE_DIR WORK_DIR MPIEXEC [ARCH]. Sets CHECK, KILN, SRC,
# MPI, ARCH (gpt2 by default, or llama), MODEL (the small test model of that architecture; exported
# as KILN_TEST_ARCH for the Python checks), enters a fresh WORK_DIR/CHECK (WORK_DIR/llama-CHECK
# for llama), and defines
#   train NP MICRO_BATCH RUN_DIR STEPS [extra kiln train flags...]
# which runs one process directly and NP > 1 under mpirun (as root, oversubscribed), and
#   rank_pid MPIRUN_PID RANK
# which prints the pid of that run's rank RANK. The Python comparisons of the checks share
# tests/python/train_compare.py (PYTHONPATH="$SRC/tests/python").
# On failure the work directory is kept and the end of its newest logs is printed (the runs'
# stderr goes to files there), so a failure seen once under load can be read afterwards. Under
# ctest every mpirun test has its own OpenMPI session directory (tests/CMakeLists.txt).
set -euo pipefail
CHECK=$1
KILN=$(readlink -f "$2")
SRC=$3
ARCH=${6:-gpt2}
WORK=$4/$CHECK
[ "$ARCH" = gpt2 ] || WORK=$4/$ARCH-$CHECK
MPI=$5
export KILN_TEST_ARCH=$ARCH
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
rm -rf "$WORK"
mkdir -p "$WORK"
cd "$WORK"
show_failure() {
  local rc=$?
  if [ "$rc" = 0 ] || [ "$rc" = 77 ]; then return 0; fi  # 77: skipped (tests/train_gpu_dist.sh)
  echo "=== $CHECK failed (exit $rc); its work directory is kept: $WORK"
  local f
  for f in $(ls -t ./*.log ./*.err ./*.out 2>/dev/null | head -4); do
    echo "=== the last 40 lines of $f:"
    tail -n 40 "$f"
  done
  return "$rc"
}
trap show_failure EXIT
MODEL=(--config "$SRC/configs/train/tiny.yaml" --set model.vocab_size=256 --set model.d_model=32
       --set model.n_layers=2 --set model.n_heads=2 --set model.seq_len=16 --set run.threads=1
       --set schedule.warmup_steps=2 --set schedule.total_steps=10)
if [ "$ARCH" = llama ]; then
  # Grouped-query attention (4 query heads on 2 key/value heads: one of each per rank at tp 2),
  # SwiGLU, RMSNorm, rotary positions, untied embeddings, no biases. Synthetic data has no
  # documents: the document mask is covered by tests/python/llama_parity.py and
  # tests/train_llama.sh on `kiln prep` data.
  MODEL+=(--set model.arch=llama --set model.n_heads=4 --set model.n_kv_heads=2
          --set model.ffn_hidden=96 --set model.doc_mask=false)
elif [ "$ARCH" != gpt2 ]; then
  echo "unknown architecture $ARCH"
  exit 2
fi
train() {  # train NP MICRO_BATCH RUN_DIR STEPS [extra...]
  local np=$1 mb=$2 dir=$3 steps=$4
  shift 4
  if [ "$np" = 1 ]; then
    "$KILN" train --quiet "${MODEL[@]}" --set data.micro_batch="$mb" --set run.dir="$dir" --set run.steps="$steps" "$@"
  else
    "$MPI" -np "$np" --oversubscribe "$KILN" train --quiet "${MODEL[@]}" --set data.micro_batch="$mb" \
      --set run.dir="$dir" --set run.steps="$steps" "$@"
  fi
}
rank_pid() {  # rank_pid MPIRUN_PID RANK: the pid of RANK among MPIRUN_PID's descendants
  # (this run's own processes: other tests may be training at the same time), or nothing.
  local kids k
  kids=$(ps -o pid= --ppid "$1" 2>/dev/null || true)
  for k in $kids; do
    # grep without -q reads to the end: with -q it exits at the match, tr can die of SIGPIPE and,
    # under pipefail, the pipeline fails although the rank matched ("rank 1 not found" flakes).
    if tr '\0' '\n' </proc/"$k"/environ 2>/dev/null | grep -x "OMPI_COMM_WORLD_RANK=$2" >/dev/null; then
      echo "$k"
      return 0
    fi
    rank_pid "$k" "$2" && return 0
  done
  return 1
}
