#!/usr/bin/env bash
# The collective watchdog on point-to-point messages: the last stage of an NP-stage pipeline waits
# for a message stage 0 never sends (stage 0 stalls for 120 s). With a 1 s timeout the job must
# end non-zero within seconds (an outer timeout of 60 s tells a hang apart), and the last stage's
# message must name the operation, the group and the peer, and say the peer has not sent it.
# Usage: comm_p2p_watchdog.sh COMM_P2P_TEST MPIRUN NP
set -uo pipefail
test_bin=$1 mpirun=$2 np=$3
log=$(mktemp)
trap 'rm -f "$log"' EXIT
start=$SECONDS
KILN_TEST_P2P_WATCHDOG=1 timeout 60 "$mpirun" -np "$np" --oversubscribe "$test_bin" \
  --gtest_filter=CommP2pWatchdog.* >"$log" 2>&1
rc=$?
took=$((SECONDS - start))
fail() {
  echo "FAIL: $1"
  echo "---- log ----"
  cat "$log"
  exit 1
}
[ "$rc" -eq 124 ] && fail "hang: the job ran until the outer timeout (60 s)"
[ "$rc" -eq 0 ] && fail "the job exited 0: the watchdog did not stop it"
[ "$took" -lt 50 ] || fail "took $took s"
last=$((np - 1))
# The message from the last stage: (with 2 stages the first message from stage 0 arrived, so the
# stalled one is recv #2; with more stages nothing came from stage 0: recv #1.)
n=$([ "$np" -eq 2 ] && echo 2 || echo 1)
sent=$([ "$np" -eq 2 ] && echo 1 || echo 0)
grep -Eq "rank $last: point-to-point timeout: recv #$n from rank 0 \(world rank 0\) on group pp \(mpi, rank $last of $np\) has not completed after [0-9.]+ s \(parallel.collective_timeout_s 1\); this rank is at step 3" "$log" ||
  fail "no timeout message naming recv #$n from rank 0 on group pp"
grep -Eq "rank $last: peer rank 0 \(world rank 0\) on pp has started $sent sends to this rank \(this is recv #$n\): it has not sent this message; at step 3; in no collective" "$log" ||
  fail "no message saying what peer rank 0 is doing"
grep -q "rank $last: stopping every rank" "$log" || fail "no 'stopping every rank'"
echo "ok: exit $rc after $took s"
grep -E "point-to-point timeout|peer rank" "$log" | sed 's/^/  /'
