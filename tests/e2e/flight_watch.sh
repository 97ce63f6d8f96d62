#!/usr/bin/env bash
# ddprun's side of the flight recorder with a small real program (rank_probe
# --allreduce: the real bootstrap and one all_reduce), docs/flight_recorder.md:
#   1. a rank that made its process group but no collective yet while the other
#      waits in the all_reduce: the hang detector ends the job with exit 124
#      and blames it (a hung job never ends as a success);
#   2. the same with the default hang timeout and DDP_TIMEOUT_S=5: the waiting
#      rank's collective times out first, and the blame goes to the stalled
#      rank the diagnosis names, not to the rank that timed out;
#   3. --hang-timeout 0 still prints the straggler report;
#   4. each rank runs three programs in turn (`sh -c 'a; b; c'`): ddprun moves
#      to each new region and never falls over a region being re-created;
#   5. the region directory is gone after ddprun exits; one left by a ddprun
#      that is gone is removed, one whose lock is held is not;
#   6. a full /dev/shm (a private mount namespace with a small full tmpfs):
#      the ranks record in their own memory and the job succeeds (skipped,
#      with a note, where mount namespaces are not allowed).
# usage: flight_watch.sh DDPRUN PROBE
set -uo pipefail
. "$(dirname "$0")/lib_ddprun.sh" "$1" "$2"
export TMPDIR="$WORK"
# region_dirs AGENT_PID: the region directories of that ddprun still in /dev/shm.
region_dirs() { ls -d /dev/shm/ddprun-flight-"$1"-* 2>/dev/null; }
probe=("$PROBE" --marker "$MARKER" --allreduce)

# 1. Rank 1 stalls after making its process group: exit 124 and blamed.
start=$(now)
"$DDPRUN" --standalone -n 2 --hang-timeout 3 --grace-period 2 "${probe[@]}" --allreduce-stall 120 \
  --on-rank 1 >"$WORK/stall.log" 2>&1 &
agent=$!
wait $agent
status=$?
took=$(elapsed_since "$start")
[ $status -eq 124 ] || fail "a rank stalled before its first collective: exit $status, expected 124"
at_most "$took" 25 || fail "the stalled job took $took s to end (--hang-timeout 3)"
pid1=$(rank_pid "$WORK/stall.log" 1)
grep -q "^ddprun: to blame: rank 1 (pid $pid1) made no progress for" "$WORK/stall.log" ||
  fail "the stalled rank 1 is not blamed"
grep -q "^ddprun: summary of restart 0" "$WORK/stall.log" || fail "no summary"
grep -q "^ddprun: flight recorder: rank 1 never entered all_reduce #0" "$WORK/stall.log" ||
  fail "the diagnosis does not name rank 1"
[ -z "$(region_dirs $agent)" ] || fail "the region directory of ddprun $agent is left: $(region_dirs $agent)"
echo "stalled before its first collective: exit 124 after $took s"

# 2. The default hang timeout (the ranks' timeout + 60 s): rank 0's all_reduce
#    times out after 5 s; rank 1, which stalled, is blamed.
DDP_TIMEOUT_S=5 "$DDPRUN" --standalone -n 2 --grace-period 2 "${probe[@]}" --allreduce-stall 120 \
  --on-rank 1 >"$WORK/timeout.log" 2>&1
status=$?
[ $status -eq 124 ] || fail "a collective timeout caused by a stalled rank: exit $status, expected 124"
pid0=$(rank_pid "$WORK/timeout.log" 0)
pid1=$(rank_pid "$WORK/timeout.log" 1)
grep -qE "^ddprun: to blame: rank 1 \(pid $pid1\) made no progress [0-9.]+ s before rank 0 \(pid $pid0\) failed: exit code 1" \
  "$WORK/timeout.log" || fail "the stalled rank 1 is not blamed for rank 0's timeout"
grep -q "first failure" "$WORK/timeout.log" && fail "the rank that timed out is marked as the first failure"
grep -q "^ddprun: no rank made progress" "$WORK/timeout.log" &&
  fail "the default hang timeout fired before the collective timeout"
echo "collective timeout: $(grep '^ddprun: to blame' "$WORK/timeout.log")"

# 3. --hang-timeout 0: no detector, the straggler report all the same.
"$DDPRUN" --standalone -n 2 --hang-timeout 0 "${probe[@]}" --allreduce-stall 0.5 --on-rank 1 \
  >"$WORK/nohang.log" 2>&1 || fail "--hang-timeout 0: exit $?"
grep -q "^ddprun: straggler report (ranks 0,1" "$WORK/nohang.log" ||
  fail "--hang-timeout 0 prints no straggler report"

# 4. Three programs per rank in turn, three times.
for i in 1 2 3; do
  "$DDPRUN" --standalone -n 2 --hang-timeout 30 sh -c \
    "$PROBE --marker $MARKER --allreduce && $PROBE --marker $MARKER --allreduce --allreduce-stall 0.3 && $PROBE --marker $MARKER --allreduce" \
    >"$WORK/seq.log" 2>&1 &
  agent=$!
  wait $agent || fail "three programs per rank (try $i): exit $?"
  [ "$(grep -c '^\[rank 0\] allreduce=3 ' "$WORK/seq.log")" -eq 3 ] || fail "not three all_reduces on rank 0"
  grep -q "^ddprun: straggler report (ranks 0,1" "$WORK/seq.log" || fail "no straggler report (try $i)"
  [ -z "$(region_dirs $agent)" ] || fail "the region directory of ddprun $agent is left"
done
echo "three programs per rank: ok"

# 5. Directories of ddprun processes that are gone.
gone=$(sh -c 'echo $$')
stale=/dev/shm/ddprun-flight-$gone-0-${MARKER: -6}
locked=/dev/shm/ddprun-flight-$gone-1-${MARKER: -6}
mkdir -p "$stale/x" "$locked/x"
flock "$locked" sleep 60 >/dev/null 2>&1 &
holder=$!
sleep 0.2
"$DDPRUN" --standalone -n 2 "${probe[@]}" >"$WORK/stale.log" 2>&1 || fail "exit $? with stale directories"
[ -e "$stale" ] && fail "$stale (its ddprun is gone, nobody holds its lock) was not removed"
[ -e "$locked" ] || fail "$locked (its lock is held) was removed"
kill $holder 2>/dev/null
wait $holder 2>/dev/null
rm -rf "$locked"
echo "stale region directories: ok"

# 6. /dev/shm full.
if [ "$(id -u)" -eq 0 ] && unshare -m true 2>/dev/null; then
  unshare -m sh -c "mount -t tmpfs -o size=256k tmpfs /dev/shm &&
    dd if=/dev/zero of=/dev/shm/fill bs=4k 2>/dev/null; exec \"$DDPRUN\" --standalone -n 2 --backend gloo $(printf '%q ' "${probe[@]}")" \
    >"$WORK/full.log" 2>&1
  status=$?
  [ $status -eq 0 ] || fail "a full /dev/shm: exit $status, expected 0 (the ranks record in their own memory)"
  grep -qE "flight recorder: cannot map [0-9]+ bytes at /dev/shm/ddprun-flight-.*is its file system full\? \`df /dev/shm/" \
    "$WORK/full.log" || fail "no warning about the full /dev/shm"
  echo "full /dev/shm: exit 0, $(grep -c 'cannot map' "$WORK/full.log") warnings"
else
  echo "note: no mount namespace here; the full /dev/shm case is not run"
fi
no_process_left 10
echo "flight_watch: ok"
