#!/usr/bin/env bash
# Exit codes and the failure summary: a rank that exits 3, one that dies of
# SIGSEGV, one that ignores SIGTERM (SIGKILL after --grace-period); the others
# are stopped at once and nothing is left behind. A script that cannot be
# executed (126, 127 as a shell), and a console nobody reads while a rank fails
# (Note [a console that does not read]: the failure still stops the job at once).
# An output directory that cannot be made (exit 2, no rank started).
# usage: ddprun_exit.sh DDPRUN PROBE
. "$(dirname "$0")/lib_ddprun.sh"
grace=2

"$DDPRUN" --standalone -n 3 "$PROBE" >"$WORK/ok.log" 2>&1 || fail "all ranks succeeded, yet exit $?"

start=$(now)
"$DDPRUN" --standalone -n 3 --grace-period $grace "$PROBE" --exit-code 3 --on-rank 1 --sleep 60 \
  --stderr-lines 12 --marker "$MARKER" >"$WORK/exit3.log" 2>&1
status=$? took=$(elapsed_since "$start")
[ $status -eq 3 ] || fail "rank 1 exited 3, ddprun exited $status"
at_most "$took" $((grace + 1)) || fail "took $took s to stop the group"
no_process_left 1
grep -qE '^ddprun:   rank 1 +pid [0-9]+ +exit code 3 .*<- first failure' "$WORK/exit3.log" ||
  fail "the summary does not name rank 1 with exit code 3"
grep -qE '^ddprun:   rank 0 +pid [0-9]+ +killed by SIGTERM' "$WORK/exit3.log" ||
  fail "the summary does not show rank 0 stopped by SIGTERM"
grep -q "^ddprun: last 10 lines of rank 1's stderr:" "$WORK/exit3.log" || fail "no stderr tail"
grep -q '^ddprun:   | err line 3$' "$WORK/exit3.log" && fail "the tail holds more than 10 lines"
grep -q '^ddprun:   | rank_probe: rank 1 failing on purpose$' "$WORK/exit3.log" || fail "tail lacks the last line"

"$DDPRUN" --standalone -n 2 --grace-period $grace "$PROBE" --signal SEGV --on-rank 0 --sleep 60 \
  --marker "$MARKER" >"$WORK/segv.log" 2>&1
status=$?
[ $status -eq 139 ] || fail "rank 0 died of SIGSEGV, ddprun exited $status (expected 128+11)"
grep -qE '^ddprun:   rank 0 +pid [0-9]+ +killed by SIGSEGV' "$WORK/segv.log" || fail "summary lacks SIGSEGV"
no_process_left 1

# Ranks that ignore SIGTERM: SIGKILL after the grace period, not before. Rank 2
# fails after 1 s, once the others surely ignore SIGTERM.
"$DDPRUN" --standalone -n 3 --grace-period $grace "$PROBE" --exit-code 4 --on-rank 2 --sleep 60 \
  --fail-after 1 --ignore-sigterm --marker "$MARKER" >"$WORK/stubborn.log" 2>&1 &
agent=$!
wait_for_lines "$WORK/stubborn.log" '^\[rank [0-9]\] pid=' 3
wait_for_lines "$WORK/stubborn.log" '^ddprun: rank 2 .*failed' 1
start=$(now)
wait $agent
status=$? took=$(elapsed_since "$start")
[ $status -eq 4 ] || fail "rank 2 exited 4, ddprun exited $status"
at_most $((grace - 1)) "$took" || fail "SIGKILL came after $took s, before the grace period"
at_most "$took" $((grace + 1)) || fail "took $took s, more than grace + 1"
grep -qE '^ddprun:   rank 0 +pid [0-9]+ +killed by SIGKILL' "$WORK/stubborn.log" || fail "no SIGKILL in summary"
no_process_left 1

# PROGRAM found but not executable as it is: 126 (no #! line, with the fix named),
# or 127 when its #! interpreter is missing, as a shell says.
printf 'echo hi\n' >"$WORK/no_shebang.sh"
printf '#!/no/such/interpreter\necho hi\n' >"$WORK/bad_shebang.sh"
chmod +x "$WORK/no_shebang.sh" "$WORK/bad_shebang.sh"
out=$("$DDPRUN" --standalone -n 2 "$WORK/no_shebang.sh" 2>&1)
status=$?
[ $status -eq 126 ] || fail "a script without #! gave exit $status, expected 126: $out"
grep -q "^ddprun: error: cannot execute '.*no_shebang.sh': .*needs a #! line" <<<"$out" ||
  fail "no hint at the #! line: $out"
out=$("$DDPRUN" --standalone -n 2 "$WORK/bad_shebang.sh" 2>&1)
status=$?
[ $status -eq 127 ] || fail "a missing #! interpreter gave exit $status, expected 127: $out"
grep -q "its #! line names '/no/such/interpreter', which does not exist" <<<"$out" ||
  fail "the missing interpreter is not named: $out"

# Note [a console that does not read]: ddprun's stdout goes to a reader that reads
# nothing for 5 s while rank 0 prints 4 MB; rank 1 fails after 1 s. ddprun must
# still stop rank 0 at once (its SIGTERM trap writes the time), not when the
# reader wakes, and what rank 0 printed must reach the reader in the end.
cat >"$WORK/flood.sh" <<EOF
#!/bin/sh
if [ "\$RANK" = 1 ]; then sleep 1; echo "rank 1 fails" >&2; exit 3; fi
trap 'date +%s.%N >"$WORK/term"; exit 143' TERM
head -c 4000000 /dev/zero | tr '\\0' x | fold -w 100
sleep 60 &
wait
EOF
chmod +x "$WORK/flood.sh"
start=$(now)
{
  "$DDPRUN" --standalone -n 2 --grace-period $grace "$WORK/flood.sh" 2>"$WORK/flood.err"
  echo $? >"$WORK/flood.status"
} | {
  sleep 5
  now >"$WORK/reader"
  wc -l >"$WORK/flood.lines"
}
[ "$(cat "$WORK/flood.status")" = 3 ] || fail "exit $(cat "$WORK/flood.status"), expected 3"
[ -f "$WORK/term" ] || fail "rank 0 got no SIGTERM: $(cat "$WORK/flood.err")"
stopped=$(awk -v a="$start" -v b="$(cat "$WORK/term")" 'BEGIN { printf "%.2f", b - a }')
at_most "$stopped" 4 || fail "rank 0 was stopped $stopped s after the start: ddprun waited for the reader"
at_most "$(cat "$WORK/term")" "$(cat "$WORK/reader")" || fail "rank 0 was stopped after the reader woke"
[ "$(cat "$WORK/flood.lines")" -ge 1 ] || fail "nothing rank 0 printed reached the reader"
no_process_left 1

# An output directory that cannot be made is a usage error (2) before any rank
# starts, for --log-dir as for --trace.
touch "$WORK/plain"
for flag in --log-dir --trace; do
  "$DDPRUN" --standalone -n 1 "$flag" "$WORK/plain/sub" "$PROBE" --marker "$MARKER" \
    >"$WORK/baddir.log" 2>&1
  status=$?
  [ $status -eq 2 ] || fail "$flag under a file: exit $status, expected 2: $(cat "$WORK/baddir.log")"
  grep -qF "ddprun: error: $flag $WORK/plain/sub: cannot create the directory" "$WORK/baddir.log" ||
    fail "$flag under a file: $(cat "$WORK/baddir.log")"
  grep -q "pid=" "$WORK/baddir.log" && fail "$flag under a file: a rank started"
done
echo "ddprun_exit: ok"
