#!/usr/bin/env bash
# SIGKILL of one rank (and its child): ddprun stops the others, exits 137,
# names the rank, and within grace + 1 s no process of the run is left.
# usage: ddprun_kill_rank.sh DDPRUN PROBE
. "$(dirname "$0")/lib_ddprun.sh"
grace=2
"$DDPRUN" --standalone -n 3 --grace-period $grace "$PROBE" --sleep 60 --child --marker "$MARKER" \
  >"$WORK/run.log" 2>&1 &
agent=$!
wait_for_lines "$WORK/run.log" '^\[rank [0-9]\] pid=' 3
victim=$(rank_pid "$WORK/run.log" 1)
start=$(now)
kill -KILL "$victim"
wait $agent
status=$?
no_process_left $(( grace + 1 ))
took=$(elapsed_since "$start")
at_most "$took" $((grace + 1)) || fail "took $took s"
[ $status -eq 137 ] || fail "rank 1 was SIGKILLed, ddprun exited $status (expected 137)"
grep -qE "^ddprun:   rank 1 +pid $victim +killed by SIGKILL .*<- first failure" "$WORK/run.log" ||
  fail "the summary does not name rank 1"
echo "ddprun_kill_rank: ok ($took s)"
