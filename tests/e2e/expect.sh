#!/usr/bin/env bash
# expect.sh CODE PATTERN -- COMMAND [ARGS...]
# Runs COMMAND; passes when it exits with CODE and its combined output matches the
# extended regular expression PATTERN. Prints the output either way.
set -uo pipefail
code=$1 pattern=$2
shift 2
[ "$1" = "--" ] && shift
output=$("$@" 2>&1)
status=$?
printf '%s\n' "$output"
if [ "$status" -ne "$code" ]; then
  echo "expect.sh: exit code $status, expected $code" >&2
  exit 1
fi
if ! grep -Ezq -- "$pattern" <<<"$output"; then
  echo "expect.sh: output does not match /$pattern/" >&2
  exit 1
fi
echo "expect.sh: ok (exit $status, matched /$pattern/)"
