#!/usr/bin/env bash
# A rank whose whole stderr is one error line (train --device cuda where there is
# none, or no CUDA in the build): ddprun's summary quotes it once ("rank 0's
# error: ...") and adds no "last 1 line of rank 0's stderr" block repeating it.
# usage: ddprun_error_once.sh DDPRUN TRAIN
set -uo pipefail
ddprun=$1 train=$2
fail() { echo "ddprun_error_once.sh: FAIL: $*" >&2; exit 1; }
out=$("$ddprun" --standalone -n 1 "$train" --device cuda:7 --data synthetic 2>&1)
status=$?
[ $status -eq 1 ] || fail "exit $status, expected 1: $out"
grep -qE "^ddprun: rank 0's error: train: error: .*cuda" <<<"$out" || fail "no quoted error: $out"
grep -q "last 1 line of rank 0's stderr" <<<"$out" && fail "the error line is repeated: $out"
[ "$(grep -c "train: error:" <<<"$out")" -eq 2 ] ||
  fail "the error should appear twice (the rank's line and the summary's quote): $out"
echo "ddprun_error_once.sh: ok"
