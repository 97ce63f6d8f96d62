#!/usr/bin/env bash
# Signals to ddprun: SIGINT and SIGTERM are forwarded to every rank (and what
# the ranks started); SIGKILL of ddprun takes the ranks with it. Nothing is
# left in any case.
# usage: ddprun_signals.sh DDPRUN PROBE
. "$(dirname "$0")/lib_ddprun.sh"
grace=2
start_run() {
  "$DDPRUN" --standalone -n 3 --grace-period $grace "$PROBE" --sleep 60 --child --marker "$MARKER" \
    >"$WORK/$1.log" 2>&1 &
  agent=$!
  wait_for_lines "$WORK/$1.log" '^\[rank [0-9]\] pid=' 3
}
for sig in INT TERM HUP; do
  start_run "$sig"
  kill -"$sig" "$agent"
  wait $agent
  status=$?
  expected=$((128 + $(kill -l "$sig")))
  [ $status -eq $expected ] || fail "SIG$sig: ddprun exited $status, expected $expected"
  grep -q "^ddprun: got SIG$sig; sending SIG$sig to 3 ranks" "$WORK/$sig.log" || fail "SIG$sig not forwarded"
  no_process_left 1
done

start_run KILL
kill -KILL "$agent"
{ wait $agent; } 2>/dev/null  # bash reports "Killed"; expected
no_process_left 1
echo "ddprun_signals: ok"
