#!/usr/bin/env bash
# Full disks and permissions (issue 13), one check per invocation:
#   full_disk.sh CHECK KILN_BINARY SOURCE_DIR WORK_DIR
# CHECK:
#   prep_enospc   `kiln prep` writing to a 2 MiB tmpfs fills it while writing shards (its work
#                 files and the first four stages fit): it stops with a message naming the path
#                 and "No space left on device"; after the file system grows, the same command
#                 resumes (from the write stage) to the output a run on a roomy disk gives
#                 (manifest, shards, removed list, tokenizer).
#   train_enospc  `kiln train` whose next checkpoint does not fit stops naming the path; latest
#                 still names the previous complete checkpoint; after the file system grows,
#                 --resume finishes with the losses of an uninterrupted run.
#   eacces        as an unprivileged user: prep into a read-only folder and train with a
#                 read-only checkpoints/ folder stop with "Permission denied" naming the path.
# The small file systems are tmpfs mounts inside a private user + mount namespace (unshare -rm),
# so no root is needed; without user namespaces the check is skipped (exit 77).
set -euo pipefail
CHECK=$1
KILN=$(readlink -f "$2")
SRC=$3
WORK=$4/$CHECK
rm -rf "$WORK"
mkdir -p "$WORK"
cd "$WORK"
if ! unshare -rm true 2>/dev/null; then
  echo "SKIP: user namespaces unavailable (unshare -rm failed)"
  exit 77
fi

corpus() {  # ~1.5 MB of distinct documents
  /usr/bin/python3 - "$1" <<'PY'
import json, random, sys
random.seed(7)
words = "river stone light forest garden window silver morning winter paper candle harbor".split()
with open(sys.argv[1], "w") as f:
    for d in range(1500):
        text = " ".join(random.choice(words) + str(random.randrange(50)) for _ in range(150))
        f.write(json.dumps({"id": f"doc{d}", "text": text}) + "\n")
PY
}
PREP_ARGS=(--threads 2 --vocab-size 300 --shard-samples 100)
MODEL=(--config "$SRC/configs/train/tiny.yaml" --set model.vocab_size=256 --set model.d_model=32
       --set model.n_layers=2 --set model.n_heads=2 --set model.seq_len=16 --set run.threads=1
       --set schedule.warmup_steps=2 --set schedule.total_steps=10 --set data.micro_batch=2)
expect_fail() {  # expect_fail LOG WHAT PATH_FRAGMENT RC
  local log=$1 what=$2 frag=$3 rc=$4
  [ "$rc" != 0 ] || { echo "FAIL: exit 0 despite $what"; cat "$log"; exit 1; }
  grep -q "$what" "$log" || { echo "FAIL: the message does not say '$what'"; cat "$log"; exit 1; }
  grep -q "$frag" "$log" || { echo "FAIL: the message does not name '$frag'"; cat "$log"; exit 1; }
  echo "ok: exit $rc: $(grep -m1 "$what" "$log")"
}
same_files() {  # same_files DIR_A DIR_B FILES...
  local a=$1 b=$2
  shift 2
  for f in "$@"; do cmp -s "$a/$f" "$b/$f" || { echo "FAIL: $f differs from the reference"; exit 1; }; done
}

case "$CHECK" in
prep_enospc)
  corpus corpus.jsonl
  "$KILN" prep --input corpus.jsonl --output ref "${PREP_ARGS[@]}" >/dev/null 2>ref.log
  mkdir -p small
  export KILN WORK
  unshare -rm bash -euo pipefail -c '
    mount -t tmpfs -o size=2m none small
    set +e
    "$KILN" prep --input corpus.jsonl --output small/out '"${PREP_ARGS[*]}"' >/dev/null 2>full.log
    rc=$?
    set -e
    echo "$rc" >full.rc
    mount -o remount,size=64m small
    "$KILN" prep --input corpus.jsonl --output small/out '"${PREP_ARGS[*]}"' >/dev/null 2>again.log
    cp -r small/out out
  '
  expect_fail full.log "No space left on device" "small/out" "$(cat full.rc)"
  grep -q "shards/" full.log || { echo "FAIL: the disk did not fill while writing shards"; cat full.log; exit 1; }
  grep -q "resuming" again.log || { echo "FAIL: the rerun did not resume"; cat again.log; exit 1; }
  same_files ref out manifest.json dedup/removed.jsonl tokenizer.json
  for s in $(cd ref && find shards -type f | sort); do same_files ref out "$s"; done
  echo "prep_enospc: the rerun on a grown disk equals the reference"
  ;;
train_enospc)
  "$KILN" train "${MODEL[@]}" --set run.dir=whole --set run.steps=8 >/dev/null 2>whole.log
  mkdir -p small
  export KILN
  MODEL_TEXT="${MODEL[*]}"
  export MODEL_TEXT
  unshare -rm bash -euo pipefail -c '
    mount -t tmpfs -o size=64m none small
    $KILN train $MODEL_TEXT --set run.dir=small/run --set run.steps=4 >/dev/null 2>first.log
    used=$(du -sk small | cut -f1)
    ck=$(du -sk small/run/checkpoints/step-00000004 | cut -f1)
    # Room for what is there plus half a checkpoint: the step-8 checkpoint cannot fit.
    mount -o remount,size=$(( used + ck / 2 ))k small
    set +e
    $KILN train $MODEL_TEXT --set run.dir=small/run --set run.steps=8 --set checkpoint.every_steps=4 \
      --resume >/dev/null 2>full.log
    echo $? >full.rc
    set -e
    cat small/run/checkpoints/latest >latest.txt
    ls small/run/checkpoints >listing.txt
    mount -o remount,size=64m small
    $KILN train $MODEL_TEXT --set run.dir=small/run --set run.steps=8 --resume >/dev/null 2>again.log
    cp -r small/run run
  '
  expect_fail full.log "No space left on device" "small/run" "$(cat full.rc)"
  [ "$(cat latest.txt)" = step-00000004 ] || { echo "FAIL: latest is $(cat latest.txt)"; exit 1; }
  if grep -q "step-00000008" listing.txt; then echo "FAIL: a partial step-8 checkpoint is listed"; cat listing.txt; exit 1; fi
  /usr/bin/python3 - <<'PY'
import json, sys
def losses(p): return [json.loads(l)["loss"] for l in open(p)]
a, b = losses("run/metrics.jsonl"), losses("whole/metrics.jsonl")
print(f"train_enospc: resumed losses {len(a)} steps, uninterrupted {len(b)}; equal: {a == b}")
sys.exit(0 if a == b and len(a) == 8 else 1)
PY
  ;;
eacces)
  corpus corpus.jsonl
  mkdir -p locked runs
  chmod 555 locked
  chmod 777 runs .
  mkdir -p runs/run/checkpoints
  chmod 777 runs/run
  chmod 555 runs/run/checkpoints
  chmod 644 corpus.jsonl
  set +e
  # unshare -U without a mapping: the process is "nobody", so the modes apply even for root.
  unshare -U "$KILN" prep --input corpus.jsonl --output locked/out "${PREP_ARGS[@]}" >/dev/null 2>prep.log
  rc=$?
  set -e
  expect_fail prep.log "Permission denied" "locked/out" "$rc"
  set +e
  unshare -U "$KILN" train "${MODEL[@]}" --set run.dir=runs/run --set run.steps=4 \
    --set checkpoint.every_steps=2 >/dev/null 2>train.log
  rc=$?
  set -e
  expect_fail train.log "Permission denied" "runs/run/checkpoints" "$rc"
  ;;
*)
  echo "unknown check $CHECK"
  exit 2
  ;;
esac
