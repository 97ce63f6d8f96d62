#!/usr/bin/env bash
# A stopped rank (SIGSTOP) is seen at once and blamed (Note [blame]): past
# --stopped-timeout it ends the job with 128 + SIGSTOP; stopped when another
# rank fails, it is blamed rather than the rank that failed waiting for it;
# continued in time, the job goes on.
# usage: ddprun_stopped.sh DDPRUN PROBE
. "$(dirname "$0")/lib_ddprun.sh"
stop_signal=$(kill -l STOP)

# Rank 1 stopped for good: the job ends after --stopped-timeout 2, blaming it.
"$DDPRUN" -n 2 --stopped-timeout 2 --grace-period 2 "$PROBE" --sleep 60 --marker "$MARKER" \
  >"$WORK/timeout.log" 2>&1 &
agent=$!
wait_for_lines "$WORK/timeout.log" '^\[rank [01]\] pid=' 2
pid=$(rank_pid "$WORK/timeout.log" 1)
start=$(now)
kill -STOP "$pid"
wait $agent
status=$?
took=$(elapsed_since "$start")
[ $status -eq $((128 + stop_signal)) ] || fail "exit $status, expected 128 + SIGSTOP = $((128 + stop_signal))"
at_most "$took" 20 || fail "the job took $took s to end after the stop (--stopped-timeout 2)"
grep -q "^ddprun: rank 1 (pid $pid) was stopped by SIGSTOP; the job ends if it is still stopped in 2 s" \
  "$WORK/timeout.log" || fail "the stop was not reported when it happened"
grep -q "^ddprun: rank 1 (pid $pid) has been stopped by SIGSTOP for [0-9.]* s (--stopped-timeout 2 s" \
  "$WORK/timeout.log" || fail "the message does not name rank 1, its pid and the time stopped"
grep -qE "^ddprun:   rank 1 +pid $pid +killed by SIGKILL .*<- to blame$" "$WORK/timeout.log" ||
  fail "the summary does not blame rank 1"
no_process_left 2
echo "stopped past the timeout: ended $took s after the stop, exit $status"

# --stopped-timeout 0: the stop alone never ends the job, but when rank 0 then
# fails, the stopped rank 1 is blamed (the others would time out waiting for it).
"$DDPRUN" -n 2 --stopped-timeout 0 --grace-period 2 "$PROBE" --sleep 60 --exit-code 5 --on-rank 0 \
  --fail-after 3 --marker "$MARKER" >"$WORK/failure.log" 2>&1 &
agent=$!
wait_for_lines "$WORK/failure.log" '^\[rank [01]\] pid=' 2
pid=$(rank_pid "$WORK/failure.log" 1)
kill -STOP "$pid"
wait $agent
status=$?
[ $status -eq $((128 + stop_signal)) ] || fail "stopped, then rank 0 failed: exit $status"
grep -q "^ddprun: rank 1 (pid $pid) was stopped by SIGSTOP [0-9.]* s before rank 0 (pid [0-9]*) failed: exit code 5" \
  "$WORK/failure.log" || fail "the stopped rank 1 is not blamed for rank 0's failure"
grep -q "the job ends if" "$WORK/failure.log" && fail "--stopped-timeout 0 announced a deadline"
no_process_left 2

# Stopped for a moment and continued: reported, and the job succeeds.
"$DDPRUN" -n 2 --stopped-timeout 30 "$PROBE" --sleep 3 --marker "$MARKER" >"$WORK/continued.log" 2>&1 &
agent=$!
wait_for_lines "$WORK/continued.log" '^\[rank [01]\] pid=' 2
pid=$(rank_pid "$WORK/continued.log" 0)
kill -STOP "$pid"
wait_for_lines "$WORK/continued.log" "^ddprun: rank 0 \(pid $pid\) was stopped by SIGSTOP" 1
kill -CONT "$pid"
wait $agent || fail "a rank continued in time: exit $?, expected 0"
grep -q "^ddprun: rank 0 (pid $pid) continued after [0-9.]* s stopped$" "$WORK/continued.log" ||
  fail "the continue was not reported"
no_process_left 2
# Every rank stopped (a whole-job pause, `pkill -STOP`) for longer than
# --stopped-timeout, then continued: a pause is the user's, and the job
# succeeds (Note [stop clocks]).
"$DDPRUN" -n 2 --stopped-timeout 1 "$PROBE" --sleep 4 --marker "$MARKER" >"$WORK/paused.log" 2>&1 &
agent=$!
wait_for_lines "$WORK/paused.log" '^\[rank [01]\] pid=' 2
pid0=$(rank_pid "$WORK/paused.log" 0)
pid1=$(rank_pid "$WORK/paused.log" 1)
kill -STOP "$pid0" "$pid1"
sleep 3
kill -CONT "$pid0" "$pid1"
wait $agent || fail "every rank paused for 3 s past --stopped-timeout 1: exit $?, expected 0"
grep -q "has been stopped" "$WORK/paused.log" && fail "a whole-job pause was judged a fault"
no_process_left 2
echo "whole-job pause of 3 s with --stopped-timeout 1: the job succeeded"

echo "ddprun_stopped: ok"
