#!/usr/bin/env bash
# bench/gpu/run.sh's kernel_sanitizer step (compute-sanitizer on the kernels' tests)
# with --allow-no-gpu --device cpu and a stand-in for compute-sanitizer
# (COMPUTE_SANITIZER): the tool, filter and flags it is given, and the table row for
# each outcome: clean, a race found, a tool that refuses the device.
# usage: gpu_run_sanitizer.sh SOURCE_DIR BUILD_DIR
set -uo pipefail
source_dir=$1 build=$2
work=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] && echo "kept $work" || rm -rf "$work"' EXIT
fail() {
  echo "gpu_run_sanitizer.sh: FAIL: $*" >&2
  exit 1
}

# The stand-in: logs its arguments, runs the program after them (as compute-sanitizer
# does) and reports as FAKE_MODE says.
cat >"$work/compute-sanitizer" <<'EOF'
#!/usr/bin/env bash
echo "DDP_NO_CUDA_MEMORY_CACHING=${DDP_NO_CUDA_MEMORY_CACHING:-unset} $*" >>"$FAKE_ARGS"
tool=""
while [[ $# -gt 0 && $1 == --* ]]; do
  [[ $1 == --tool ]] && tool=$2
  case "$1" in --tool | --error-exitcode | --print-limit | --report-api-errors) shift 2 ;; *) shift ;; esac
done
echo "========= COMPUTE-SANITIZER"
if [[ $FAKE_MODE == unsupported ]]; then
  echo "========= Error: Device not supported"
  exit 1
fi
"$@"
rc=$?
# racecheck ends with its own summary line, the others with ERROR SUMMARY.
if [[ $tool == racecheck ]]; then
  if [[ $FAKE_MODE == race ]]; then
    echo "========= Error: Race reported between Write access at 0x40 in block_sum and Read access at 0x80 in block_sum [8 hazards]"
    echo "========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)"
    exit 86
  fi
  echo "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)"
  exit $rc
fi
echo "========= ERROR SUMMARY: 0 errors"
exit $rc
EOF
chmod +x "$work/compute-sanitizer"

# run MODE: run.sh's step into $work/MODE.out; its exit code in rc.
run() {
  FAKE_MODE=$1 FAKE_ARGS="$work/$1.args" COMPUTE_SANITIZER="$work/compute-sanitizer" \
    "$source_dir/bench/gpu/run.sh" --prebuilt "$build" --allow-no-gpu --device cpu \
    --only kernel_sanitizer --out "$work/$1" >"$work/$1.out" 2>&1
  rc=$?
}

run clean
[ "$rc" -eq 0 ] || { cat "$work/clean.out" >&2; fail "clean: run.sh exited $rc"; }
grep -qE '^\| kernel_sanitizer \| ok \| 0 errors from memcheck racecheck synccheck \|' "$work/clean.out" ||
  { cat "$work/clean.out" >&2; fail "clean: no ok row naming the three tools"; }
for tool in memcheck racecheck synccheck; do
  # memcheck with every tensor its own allocation (Note [no caching]), the others cached.
  no_caching=0
  [ "$tool" = memcheck ] && no_caching=1
  grep -q -- "^DDP_NO_CUDA_MEMORY_CACHING=$no_caching --tool $tool --error-exitcode 86 .*--report-api-errors no .*ddp_unit_tests --gtest_filter=TransformerOps" \
    "$work/clean.args" || { cat "$work/clean.args" >&2; fail "clean: $tool was not run on the tests (DDP_NO_CUDA_MEMORY_CACHING=$no_caching)"; }
done
echo "clean: ok, each tool run on the tests, memcheck without the cache"

run race
[ "$rc" -eq 1 ] || { cat "$work/race.out" >&2; fail "race: run.sh exited $rc, expected 1"; }
grep -qE '^\| kernel_sanitizer \| FAILED: racecheck 1 error\(s\): Error: Race reported between Write access .*\| 0 errors from memcheck synccheck \|' \
  "$work/race.out" || { cat "$work/race.out" >&2; fail "race: the row does not name racecheck's report"; }
echo "race: FAILED, naming racecheck's first report"

run unsupported
[ "$rc" -eq 0 ] || { cat "$work/unsupported.out" >&2; fail "unsupported: run.sh exited $rc"; }
grep -qE '^\| kernel_sanitizer \| skipped: compute-sanitizer cannot instrument this device or runtime: (Error: )?Device not supported' \
  "$work/unsupported.out" || { cat "$work/unsupported.out" >&2; fail "unsupported: not skipped by name"; }
echo "unsupported: skipped, naming the tool's refusal"
echo "gpu_run_sanitizer.sh: ok"
