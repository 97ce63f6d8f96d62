#!/usr/bin/env bash
# trace_mpirun.sh MPIRUN... -- TRAIN: `DDP_TRACE=DIR mpirun -np 2 train` (no
# ddprun, no store: the mpi backend) leaves DIR/trace.json, merged by rank 0 at
# the end of the run, with the ranks aligned to rank 0's clock over the
# communicator; check_trace.py accepts it as in trace_ddprun.sh.
set -uo pipefail
mpirun=()
while [ "$1" != "--" ]; do mpirun+=("$1"); shift; done
shift
train=$1
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "trace_mpirun.sh: FAIL: $*" >&2; exit 1; }

out=$(DDP_TRACE="$work/t" DDP_TRACE_TEST_SKEW_NS=-2000000000 "${mpirun[@]}" \
        -x DDP_TRACE -x DDP_TRACE_TEST_SKEW_NS -np 2 "$train" --backend mpi --data synthetic \
        --synthetic-size 1280 --batch-size 64 --epochs 1 --bucket-cap-mb 0.2 2>&1)
status=$?
printf '%s\n' "$out" | tail -4
[ "$status" -eq 0 ] || fail "mpirun exit code $status"
grep -q "trace: merged 2 rank(s)" <<<"$out" || fail "rank 0 did not say it merged 2 ranks"
grep -q 'rank 0 (all_gather rounds)' "$work/t/trace.json" || fail "not aligned to rank 0"
python3 "$here/check_trace.py" "$work/t/trace.json" --ranks 2 --steps 10 --buckets ||
  fail "the merged trace is wrong"
echo "trace_mpirun.sh: ok"
