#!/usr/bin/env bash
# --max-restarts: the whole group restarts, DDPRUN_RESTART_COUNT counts up, and
# the last attempt's result is ddprun's.
# usage: ddprun_restart.sh DDPRUN PROBE
. "$(dirname "$0")/lib_ddprun.sh"
# Rank 1 fails in attempts 0 and 1; attempt 2 succeeds.
"$DDPRUN" --standalone -n 2 --grace-period 2 --max-restarts 2 "$PROBE" --exit-code 5 --on-rank 1 \
  --fail-until-restart 2 --sleep 1 --marker "$MARKER" >"$WORK/recover.log" 2>&1
status=$?
[ $status -eq 0 ] || fail "the third attempt succeeded, ddprun exited $status"
# Rank 1 prints before it fails; rank 0 may be stopped before it printed, but
# it runs the last attempt to the end.
got=$(sed -n "s/^\[rank 1\] DDPRUN_RESTART_COUNT=//p" "$WORK/recover.log" | tr '\n' ' ')
[ "$got" = "0 1 2 " ] || fail "rank 1 saw restart counts '$got', expected '0 1 2 '"
got=$(sed -n "s/^\[rank 1\] TORCHELASTIC_RESTART_COUNT=//p" "$WORK/recover.log" | tr '\n' ' ')
[ "$got" = "0 1 2 " ] || fail "rank 1 saw TORCHELASTIC_RESTART_COUNT '$got', expected '0 1 2 '"
grep -qx '\[rank 1\] TORCHELASTIC_MAX_RESTARTS=2' "$WORK/recover.log" || fail "no TORCHELASTIC_MAX_RESTARTS=2"
grep -qx '\[rank 0\] DDPRUN_RESTART_COUNT=2' "$WORK/recover.log" || fail "rank 0 did not run restart 2"
grep -q '^ddprun: restarting the group: restart 2 of 2$' "$WORK/recover.log" || fail "no restart message"
no_process_left 1

# The real bootstrap again after a restart: each attempt gets a fresh store, so
# the second attempt's all_reduce does not trip over the first one's keys.
"$DDPRUN" --standalone -n 3 --grace-period 2 --max-restarts 1 --backend gloo "$PROBE" --allreduce --exit-code 3 \
  --on-rank 2 --fail-until-restart 1 --marker "$MARKER" >"$WORK/bootstrap.log" 2>&1 ||
  fail "all_reduce after a restart: ddprun exited $?"
[ "$(grep -c '^\[rank [0-2]\] allreduce=6 backend=' "$WORK/bootstrap.log")" -eq 6 ] ||
  fail "expected 3 ranks x 2 attempts with all_reduce = 6"

# Always failing: K restarts, then the rank's exit code.
"$DDPRUN" --standalone -n 2 --grace-period 2 --max-restarts 1 "$PROBE" --exit-code 6 --on-rank 0 \
  --sleep 30 --marker "$MARKER" >"$WORK/give_up.log" 2>&1
status=$?
[ $status -eq 6 ] || fail "ddprun exited $status after the restarts, expected 6"
[ "$(grep -c '^\[rank 0\] DDPRUN_RESTART_COUNT=' "$WORK/give_up.log")" -eq 2 ] || fail "expected 2 attempts"
grep -q '^ddprun: no restarts left (--max-restarts 1)$' "$WORK/give_up.log" || fail "no 'no restarts left'"
no_process_left 1
echo "ddprun_restart: ok"
