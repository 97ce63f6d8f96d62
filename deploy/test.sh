#!/usr/bin/env bash
# Installs what is missing, configures, builds and runs the test suite.
#
#   deploy/test.sh [--build-dir DIR] [--cpu-only | --emulate-cuda]
#                  [--sanitize address|thread]
#                  [--werror | --no-werror] [--label L] [--exclude-label L] [--no-install]
#                  [--jobs N] [--no-rerun]
#
#   --build-dir DIR    build folder (default: build)
#   --cpu-only         configure with -DDDP_CUDA=OFF (default: CUDA when nvcc is found)
#   --emulate-cuda     configure with -DDDP_CUDA=EMULATE: the CUDA kernels compiled as
#                      C++ for a CUDA device emulated on the CPU, where the gpu tests
#                      run (Note [emulated CUDA device]; needs the toolkit's headers)
#   --sanitize KIND    sanitizer build: address (ASan + UBSan) or thread (TSan)
#   --werror           compiler warnings are errors (the default, as in CI)
#   --no-werror        let compiler warnings pass
#   --label L          run only ctest tests with label L (unit, gpu, ...)
#   --exclude-label L  leave out tests with label L (CI's sanitizer phase: long;
#                      default: quick, the quick siblings, whose cases their long
#                      tests run too)
#   --no-install       skip deploy/install-deps.sh
#   --jobs N           parallel build and test jobs (default: nproc to build,
#                      nproc + 1 tests: many of them wait on timeouts and ranks)
#   --no-rerun         a failed test fails the run at once (default: it runs once
#                      more, and one that passes then is listed as flaky at the end)
#
# gpu-labelled tests need a GPU (or --emulate-cuda); without one they are reported as
# skipped and the reason is printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=build
cuda=AUTO
sanitize=""
werror=ON
label=""
exclude_label=""
install=1
jobs=$(nproc)
test_jobs=""
rerun=1
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build_dir=$2; shift 2 ;;
    --cpu-only) cuda=OFF; shift ;;
    --emulate-cuda) cuda=EMULATE; shift ;;
    --sanitize) sanitize=$2; shift 2 ;;
    --werror) werror=ON; shift ;;
    --no-werror) werror=OFF; shift ;;
    --label) label=$2; shift 2 ;;
    --exclude-label) exclude_label=$2; shift 2 ;;
    --no-install) install=0; shift ;;
    --jobs) jobs=$2; test_jobs=$2; shift 2 ;;
    --no-rerun) rerun=0; shift ;;
    -h|--help) sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "deploy/test.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done

# After an install the data sets must be there: their tests fail rather than skip.
if [ "$install" = 1 ]; then
  bash deploy/install-deps.sh --with-peer
  export DDP_REQUIRE_DATA=1
fi

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
# Sanitizer builds use -O1: they check behaviour, and -O3 doubles their build time.
# -g1 (line tables): crash and sanitizer reports keep file:line, and the build is
# a third faster than with -g (measured: 21.3 -> 14.0 s for store_test.cpp under
# ASan, 12.4 -> 7.8 s at -O3); configure a build of your own with -g to debug.
# Both precompile the common headers (Note [precompiled headers] in CMakeLists.txt).
opt="-O3 -g1 -DNDEBUG" pch=ON
[ -n "$sanitize" ] && opt="-O1 -g1 -DNDEBUG"
# A CPU-only sanitizer build leaves out the gpu test binary: without CUDA its tests
# only skip, and the CUDA-compiled build (CI's first phase) compiles and skips them.
gpu_tests=ON
[ -n "$sanitize" ] && [ "$cuda" = OFF ] && gpu_tests=OFF
cmake -S . -B "$build_dir" "${generator[@]}" -DDDP_CUDA="$cuda" -DDDP_SANITIZE="$sanitize" \
  -DDDP_WERROR="$werror" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$opt" \
  -DDDP_BUILD_GPU_TESTS="$gpu_tests" -DDDP_PRECOMPILED_HEADERS="$pch"
cmake --build "$build_dir" --parallel "$jobs"

# One test more than there are cores: many e2e tests spend much of their time
# waiting (hang and stop timeouts, ranks starting, rendezvous), and one more test
# fills those gaps. On 2 cores, 35 of CI's e2e tests took 253 s at 3 against 311 s
# at 2 (docs/building.md, "CI"); a CPU-bound test only shares the cores.
[ -z "$test_jobs" ] && test_jobs=$((jobs + 1))
# With more tests than cores, a BLAS or OpenMP thread spinning between its jobs takes a
# core from another test: OpenBLAS spins 2^28 cycles before it sleeps, libgomp (oneDNN,
# PyTorch) 300000 iterations. Both sleep at once here (unless set): the long tests
# alone, 3 at a time in CI's first build, took 379 s instead of 434 (1136
# test-seconds instead of 1297) on a 2-core AVX-512 EPYC; a whole fresh-clone CI
# showed no gain in its first phase, the machine slower that run (docs/building.md).
# What a test checks does not depend on it (a thread's wake-up after its sleep makes
# a step slower, not different).
export OPENBLAS_THREAD_TIMEOUT="${OPENBLAS_THREAD_TIMEOUT:-4}" OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
ctest_args=(--test-dir "$build_dir" --output-on-failure --parallel "$test_jobs" --timeout 600)
[ -n "$label" ] && ctest_args+=(-L "$label")
# A test labelled quick runs some cases of a test labelled long (tests/CMakeLists.txt),
# for a run that leaves the long ones out; a run with them has no need of it.
[ -z "$exclude_label" ] && [ "$label" != quick ] && exclude_label=quick
[ -n "$exclude_label" ] && ctest_args+=(-LE "^${exclude_label}\$")
# Multi-rank fault tests race real processes against timeouts; on a loaded
# machine one can lose a race. A failed test runs once more (docs/building.md):
# a broken test still fails, and one that passed only on its second run is
# named at the end so that it gets looked at, never hidden.
[ "$rerun" = 1 ] && ctest_args+=(--repeat until-pass:2)
status=0
log="$build_dir/ctest-output.log"
ctest "${ctest_args[@]}" 2>&1 | tee "$log" || status=$?
# A test number seen both failing and passing is a test that passed on its rerun.
flaky=$(awk '/Test +#[0-9]+: / {
    match($0, /#[0-9]+: /); n = substr($0, RSTART + 1, RLENGTH - 3)
    name = substr($0, RSTART + RLENGTH); sub(/ [.]+.*$/, "", name); names[n] = name
    if ($0 ~ /[*][*][*](Failed|Timeout|Exception)/) failed[n] = 1
    else if ($0 ~ / Passed /) passed[n] = 1
  }
  END { for (n in failed) if (n in passed) print names[n] }' "$log")
if [ -n "$flaky" ]; then
  echo "flaky: these tests failed once and passed when run again; look at them:"
  while read -r name; do echo "  $name"; done <<<"$flaky"
fi

# Say why gpu tests skipped, once, rather than leaving a silent "Skipped".
if [ "$cuda" != EMULATE ] && [ -x "$build_dir/bin/ddp_gpu_tests" ]; then
  reason=$("$build_dir/bin/ddp_gpu_tests" --gtest_brief=1 2>&1 | grep -m1 -o "no CUDA device:.*" || true)
  [ -n "$reason" ] && echo "gpu tests skipped: $reason"
fi
exit $status
