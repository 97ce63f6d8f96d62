#!/usr/bin/env bash
# A rank whose whole stderr is one error line (train --device cuda where there is
# none, or no CUDA in the build): ddprun's summary quotes it once ("rank 0's
# error: ...") and adds no "last 1 line of rank 0's stderr" block repeating it;
# ranks failing alike print the line once and echo it (Note [one error per job]),
# and lines that state no error (a log line, a traceback's header) are never echoed.
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

# Note [one error per job]: three ranks failing alike print the error once; the others
# (those that print before ddprun stops them) echo it.
out=$("$ddprun" --standalone -n 3 "$train" --data missing.csv 2>&1)
[ "$(grep -c "^\[rank [0-2]\] train: error: missing.csv: file not found" <<<"$out")" -eq 1 ] ||
  fail "the error line should be printed by one rank: $out"
# ddprun stops the others after the first failure, so a slow rank may not get to print.
echoes=$(grep -cE "^\[rank [0-2]\] the same error as rank [0-2]$" <<<"$out")
[ "$echoes" -le 2 ] || fail "more echoes than other ranks: $out"
# Healthy ranks log alike, and every Python traceback starts with one header: no
# such line is an error of its own, so each rank's is shown.
# shellcheck disable=SC2016 # $RANK is the rank's, expanded by its shell
out=$("$ddprun" --standalone -n 3 -- sh -c 'sleep 0.$RANK; echo "epoch 1: validation error 0.25" >&2
  echo "Traceback (most recent call last):" >&2; echo "  File x.py, line $RANK" >&2' 2>&1) ||
  fail "exit $?: $out"
[ "$(grep -cE "^\[rank [0-2]\] epoch 1: validation error 0.25$" <<<"$out")" -eq 3 ] ||
  fail "a healthy rank's log line was echoed: $out"
[ "$(grep -cE "^\[rank [0-2]\] Traceback \(most recent call last\):$" <<<"$out")" -eq 3 ] ||
  fail "a traceback's header was echoed: $out"
grep -q "the same error" <<<"$out" && fail "lines that state no error were echoed: $out"
echo "ddprun_error_once.sh: ok"
