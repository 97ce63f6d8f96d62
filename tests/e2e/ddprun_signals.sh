#!/usr/bin/env bash
# Signals to ddprun: SIGINT and SIGTERM are forwarded to every rank (and what
# the ranks started); SIGUSR1 to every rank with a flight recorder, which dumps
# it, and the job goes on; SIGKILL of ddprun takes the ranks with it. Nothing is
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

# SIGUSR1 to ddprun (Note [SIGUSR1 to ddprun] in launcher/group.cpp): forwarded to
# every rank that has a flight recorder, which dumps it while the job goes on; a
# rank without one yet (before its process group) is left alone, not killed. Sent
# until both ranks got it (they sleep 6 s in their process group first). Sent to
# ddprun's whole process group (as `kill -USR1 %1` does), its watchdog included,
# which must live on (Note [no orphans]): ddprun starts in a session of its own.
DDP_FLIGHT_DIR="$WORK/usr1" setsid "$DDPRUN" --standalone -n 2 "$PROBE" --allreduce \
  --allreduce-stall 6 --marker "$MARKER" >"$WORK/USR1.log" 2>&1 &
agent=$!
wait_for_lines "$WORK/USR1.log" '^\[rank [0-9]\] pid=' 2
deadline=$((SECONDS + 6))
until grep -q "^ddprun: got SIGUSR1: sent it to ranks 0,1, which dump" "$WORK/USR1.log"; do
  [ $SECONDS -ge $deadline ] && fail "SIGUSR1 never reached both ranks"
  kill -USR1 -- "-$agent"
  sleep 0.2
done
# ddprun's children other than its ranks (probes): the watchdog, alive and not a zombie.
for child in $(pgrep -P "$agent"); do
  grep -q -- "$PROBE" "/proc/$child/cmdline" 2>/dev/null && continue
  state=$(ps -o stat= -p "$child" 2>/dev/null)
  [[ $state == Z* ]] && fail "SIGUSR1 to ddprun's process group killed its watchdog (pid $child)"
done
wait $agent
status=$?
[ $status -eq 0 ] || fail "SIGUSR1: ddprun exited $status, expected 0 (the job goes on)"
[ "$(grep -c '^\[rank [01]\] allreduce=3 ' "$WORK/USR1.log")" -eq 2 ] ||
  fail "SIGUSR1: the ranks did not finish their all_reduce"
grep -qE "sending SIG|summary of restart" "$WORK/USR1.log" && fail "SIGUSR1 ended the job"
for r in 0 1; do
  grep -q '"reason": *"SIGUSR1"' "$WORK/usr1/flight_rank_$r.json" 2>/dev/null ||
    fail "SIGUSR1: no dump of rank $r in $WORK/usr1"
done
no_process_left 1
# Ranks without a flight recorder (no process group): SIGUSR1 would end them.
"$DDPRUN" --standalone -n 2 "$PROBE" --sleep 1 --marker "$MARKER" >"$WORK/USR1_early.log" 2>&1 &
agent=$!
wait_for_lines "$WORK/USR1_early.log" '^\[rank [0-9]\] pid=' 2
kill -USR1 "$agent"
wait $agent
status=$?
[ $status -eq 0 ] || fail "SIGUSR1 before any flight recorder: ddprun exited $status, expected 0"
grep -q "^ddprun: got SIGUSR1: no rank to dump its flight recorder; not to ranks 0,1 (no flight \
recorder yet" "$WORK/USR1_early.log" || fail "SIGUSR1 before any flight recorder: not said so"

start_run KILL
kill -KILL "$agent"
{ wait $agent; } 2>/dev/null  # bash reports "Killed"; expected
no_process_left 1
echo "ddprun_signals: ok"
