#!/usr/bin/env bash
# Plants each fault of a table in an op's output and checks that the tests named for
# it fail (Note [planted faults] in runtime/planted_fault.h). See --help.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

usage() {
  cat <<'EOF'
usage: bench/gpu/planted_faults.sh --tests BIN [options]

For every line of the table (default bench/gpu/planted_faults.txt: OP:ARG:MODE, gpu
tests, cpu tests), runs BIN --gtest_filter=<that device's tests> with
DDP_TEST_PLANT_FAULT=DEVICE:OP:ARG:MODE, which corrupts that op's output on that
device after every call. Each filter first runs once without a fault and must pass
(else its lines are "no baseline"; the filters' union runs once first, each filter on
its own only where that does not settle it). Then each fault runs with --gtest_fail_fast (its
first failing test ends the run: the counts below are up to there) and is reported as
  caught       the tests failed (or crashed) with the fault applied
  NOT CAUGHT   the tests passed although the fault changed the op's output: tests
               that do not look at that output, or too loosely
  not reached  the fault never changed an output (a wrong filter, ARG or op name,
               tests that skipped, or outputs it cannot change: empty, infinite)
  timed out    the run took longer than --timeout
A line ends with "applied N time(s)" from the process. Lines whose tests for DEVICE
are "-" are left out.

options:
  --tests BIN       the gtest binary: ddp_gpu_tests with --device cuda (on a GPU),
                    ddp_unit_tests with --device cpu (the CPU check of the table)
  --device D        cuda (default) or cpu: which column, and the fault's device
  --table FILE      the table (default: planted_faults.txt next to this script)
  --only REGEX      only the lines whose fault matches REGEX (grep -E)
  --timeout S       seconds for each run (default 120)
  --budget S        seconds for the whole script (default 0: none): no run starts after
                    S - --timeout seconds; the lines left are reported "not run"
  --log FILE        every run's output, appended (default: none)
  --no-baseline     leave out the runs without a fault: only where the same tests run
                    beside this script and fail the whole check when they fail (CI's
                    ctest runs every gpu test in the phase that runs this); a filter that
                    matches no test still says "not reached"
  --emulated        the CUDA device is the CPU's emulation (Note [emulated CUDA device]
                    in runtime/cuda/emu/kernel_emu.h; a -DDDP_CUDA=EMULATE build): runs
                    with DDP_CUDA_EMULATION=2 unless it is set, and leaves out the
                    library lines (cuBLASLt, cuDNN: "-" in the cpu column), which the
                    emulation does not have
  -h, --help        this help

Exit code: 0 when every fault was caught, 1 when one was not (or a baseline failed),
3 when every fault that ran was caught but --budget left some not run, 2 usage error.
EOF
}

tests="" device=cuda table="$here/planted_faults.txt" only="" timeout_s=120 log=/dev/null budget=0
emulated=0 with_baseline=1
die_usage() { echo "planted_faults.sh: $*" >&2; exit 2; }
need_value() { [[ $# -ge 2 && -n "$2" ]] || die_usage "$1 needs a value (see --help)"; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --tests) need_value "$@"; tests="$2"; shift 2 ;;
    --device) need_value "$@"; device="$2"; shift 2 ;;
    --table) need_value "$@"; table="$2"; shift 2 ;;
    --only) need_value "$@"; only="$2"; shift 2 ;;
    --timeout) need_value "$@"; timeout_s="$2"; shift 2 ;;
    --log) need_value "$@"; log="$2"; shift 2 ;;
    --budget) need_value "$@"; budget="$2"; shift 2 ;;
    --emulated) emulated=1; shift ;;
    --no-baseline) with_baseline=0; shift ;;
    -h | --help) usage; exit 0 ;;
    *) die_usage "unknown option '$1'; valid: --tests, --device, --table, --only, --timeout, --budget, --log, --emulated, --no-baseline, --help" ;;
  esac
done
[[ -n "$tests" ]] || die_usage "--tests BIN is required (ddp_gpu_tests or ddp_unit_tests)"
[[ -x "$tests" ]] || die_usage "--tests $tests: not an executable file"
[[ $device == cuda || $device == cpu ]] || die_usage "--device '$device': valid values are cuda, cpu"
[[ -r "$table" ]] || die_usage "--table $table: no such file"
[[ $timeout_s =~ ^[0-9]+$ && $timeout_s -gt 0 ]] || die_usage "--timeout '$timeout_s': expected whole seconds > 0"
[[ $budget =~ ^[0-9]+$ ]] || die_usage "--budget '$budget': expected whole seconds (0: none)"
[[ $emulated -eq 1 && $device != cuda ]] && die_usage "--emulated is for --device cuda (the emulated CUDA device)"
if [[ $emulated -eq 1 ]]; then
  export DDP_CUDA_EMULATION="${DDP_CUDA_EMULATION:-2}"
  # The emulated cuBLAS's OpenBLAS would leave idle threads spinning on the other
  # cores between its GEMMs (docs/building.md, "The emulated CUDA device").
  export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"
fi
# time_left: whether another run of up to --timeout seconds fits the --budget.
time_left() { [[ $budget -eq 0 || $((SECONDS + timeout_s)) -le $budget ]]; }

column=2
[[ $device == cpu ]] && column=3
out=$(mktemp)
trap 'rm -f "$out"' EXIT

# The table's lines for this device: fault and filter.
faults=() filters=() library=0
while read -r fault gpu cpu rest; do
  [[ -z "$fault" || "$fault" == \#* ]] && continue
  [[ -n "$rest" || -z "$cpu" ]] && { echo "planted_faults.sh: $table: '$fault $gpu $cpu $rest': expected three columns" >&2; exit 2; }
  [[ -n "$only" ]] && ! grep -qE -- "$only" <<<"$fault" && continue
  filter=$gpu
  [[ $column -eq 3 ]] && filter=$cpu
  [[ "$filter" == "-" ]] && continue
  [[ $emulated -eq 1 && "$cpu" == "-" ]] && { library=$((library + 1)); continue; }
  faults+=("$fault") filters+=("$filter")
done <"$table"
[[ $library -gt 0 ]] && echo "left out $library library line(s) (cuBLASLt, cuDNN): the emulated device has no such libraries"

# run SPEC FILTER: the tests under the fault SPEC ("" for none) into $out; sets rc,
# applied (how often the fault changed an output), passed and failed. Under a fault
# the first failing test settles the verdict, so the run stops there (--gtest_fail_fast;
# it ran every test of its filter before: 301 s for the emulated device in CI).
run() {
  env -u DDP_TEST_PLANT_FAULT ${1:+"DDP_TEST_PLANT_FAULT=$1"} timeout -k 10 "${run_timeout:-$timeout_s}" "$tests" \
    --gtest_filter="$2" ${1:+--gtest_fail_fast} >"$out" 2>&1 </dev/null
  rc=$?
  { echo "==== ${1:-no fault} ($2): exit $rc"; cat "$out"; } >>"$log"
  applied=$(sed -n 's/^ddp: planted fault .* applied \([0-9][0-9]*\) time(s)$/\1/p' "$out" | tail -1)
  # A run that crashed or timed out never printed the count: the first application says it was reached.
  [[ -z "$applied" ]] && grep -q '^ddp: planted fault .* applied for the first time$' "$out" && applied="1+"
  applied=${applied:-0}
  passed=$(sed -n 's/^\[  PASSED  \] \([0-9][0-9]*\) test.*/\1/p' "$out" | tail -1)
  passed=${passed:-0}
  failed=$(grep -c '^\[  FAILED  \] .* ([0-9]* ms)$' "$out")
}

# Each filter once without a fault: it must pass, or its failures say nothing. Their
# union runs first, in one process: the filters share tests (VecMapGpu.Elementwise*, in
# five of them, takes 5 s a run on the emulated device under ASan), so that runs each
# test once. A filter is settled by it when the union passed and one of the filter's
# patterns names a test that passed there; the others (all when the union failed) run
# on their own, which says which filter fails or runs nothing. (A test that passes
# only after another filter's tests ran would pass the union and fail alone: its
# fault's line then says "caught" wrongly. gtest runs tests in the order they are
# declared, which the filters do not change.) The union gets --timeout for each
# filter, and runs only where that fits the --budget.
declare -A baseline=()
distinct=()
for filter in "${filters[@]}"; do
  [[ " ${distinct[*]} " == *" $filter "* ]] || distinct+=("$filter")
done
# --no-baseline: the tests' own runs beside this script stand for the baseline.
if [[ $with_baseline -eq 0 ]]; then
  for filter in "${distinct[@]}"; do baseline[$filter]=ok; done
fi
union=$(IFS=:; echo "${distinct[*]}")
run_timeout=$((timeout_s * ${#distinct[@]}))
if [[ $with_baseline -eq 1 && ${#distinct[@]} -gt 1 && $union != *-* ]] &&
  [[ $budget -eq 0 || $((SECONDS + run_timeout)) -le $budget ]]; then
  run "" "$union"
  if [[ $rc -eq 0 && $passed -gt 0 ]]; then
    mapfile -t ok_tests < <(sed -n 's/^\[       OK \] \([^ ]*\) (.*/\1/p' "$out")
    for filter in "${distinct[@]}"; do
      IFS=: read -r -a patterns <<<"$filter"
      for test in "${ok_tests[@]}"; do
        for pattern in "${patterns[@]}"; do
          # shellcheck disable=SC2053 # a gtest pattern: * and ? as in a glob
          [[ $test == $pattern ]] && { baseline[$filter]=ok; break 2; }
        done
      done
    done
  fi
fi
unset run_timeout
for filter in "${distinct[@]}"; do
  [[ -n "${baseline[$filter]+x}" ]] && continue
  time_left || break
  run "" "$filter"
  if [[ $rc -eq 0 && $passed -gt 0 ]]; then
    baseline[$filter]=ok
  else
    baseline[$filter]="exit $rc, $passed passed, $failed failed"
    why="fails without a fault"
    [[ $rc -eq 0 && $passed -eq 0 ]] && why="runs no test without a fault (all skipped, or none matched)"
    printf '%-12s %-44s %s\n' "BASELINE" "$filter" "$why: ${baseline[$filter]}"
  fi
done

caught=0 missed=0 unreached=0 other=0 not_run=0
for i in "${!faults[@]}"; do
  spec="$device:${faults[$i]}" filter=${filters[$i]}
  if [[ -z "${baseline[$filter]+x}" ]] || ! time_left; then
    printf '%-12s %-44s the --budget of %s s ran out\n' "not run" "$spec" "$budget"
    not_run=$((not_run + 1))
    continue
  fi
  if [[ ${baseline[$filter]} != ok ]]; then
    printf '%-12s %-44s its tests fail without it (%s)\n' "no baseline" "$spec" "${baseline[$filter]}"
    other=$((other + 1))
    continue
  fi
  run "$spec" "$filter"
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then
    verdict="timed out"
    other=$((other + 1))
  elif [[ $applied == 0 ]]; then
    verdict="not reached"
    unreached=$((unreached + 1))
  elif [[ $rc -ne 0 ]]; then
    verdict="caught"
    caught=$((caught + 1))
  else
    verdict="NOT CAUGHT"
    missed=$((missed + 1))
  fi
  printf '%-12s %-44s %s passed, %s failed, exit %s, applied %s time(s)\n' "$verdict" "$spec" \
    "$passed" "$failed" "$rc" "$applied"
done
total=${#faults[@]}
echo "planted faults on $device: $caught of $total caught, $missed not caught, $unreached not reached, $other timed out or without a passing baseline, $not_run not run"
[[ $total -gt 0 && $caught -eq $total ]] && exit 0
[[ $total -gt 0 && $not_run -gt 0 && $((caught + not_run)) -eq $total ]] && exit 3
exit 1
