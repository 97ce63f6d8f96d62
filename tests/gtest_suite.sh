#!/usr/bin/env bash
# gtest_suite.sh BINARY SUITE: runs one GoogleTest suite of BINARY (Note [tests per
# suite] in tests/gtest_suites.cmake) and exits with its status, except that a
# suite whose tests all skipped (none passed, none failed) exits 77, which ctest
# reports as skipped rather than passed. A suite where some tests passed and some
# skipped passes; gtest's output lists the skipped ones. A suite with no test fails.
set -uo pipefail
binary=$1 suite=$2
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$binary" --gtest_filter="$suite.*" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
if [ "$status" -eq 0 ] && grep -q '^\[==========\] 0 tests from' "$log"; then
  echo "gtest_suite.sh: $binary has no suite $suite" >&2
  exit 1
fi
if [ "$status" -eq 0 ] && grep -q '^\[  PASSED  \] 0 tests\.' "$log" && grep -q '^\[  SKIPPED \]' "$log"; then
  echo "gtest_suite.sh: every test of $suite skipped"
  exit 77
fi
exit "$status"
