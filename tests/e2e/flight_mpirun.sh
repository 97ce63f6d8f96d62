#!/usr/bin/env bash
# The flight recorder without ddprun: `mpirun -np 2 train` (the mpi backend,
# what auto picks there) with a short collective timeout (DDP_TIMEOUT_S=20:
# short, yet long enough that a rank starting late on a loaded machine does
# not time out in DDP's first broadcast instead).
# Rank 1 sleeps in its forward (DDP_TEST_SLOW_RANK) far past the timeout, so
# rank 0 times out waiting in the bucket's all_reduce, writes its dump to
# DDP_FLIGHT_DIR and exits 1; mpirun then kills rank 1, which leaves no dump.
# `ddprun analyze DIR` must name rank 1 as the rank that never entered the
# all_reduce rank 0 waited in. The same with SIGUSR1: both ranks dump and the
# run goes on.
# usage: flight_mpirun.sh MPIRUN DDPRUN TRAIN  (MPIRUN "none": skip, exit 77)
set -uo pipefail
mpirun=$1 ddprun=$2 train=$3
[ "$mpirun" != none ] || { echo "skip: this build has no MPI"; exit 77; }
command -v "$mpirun" >/dev/null || { echo "skip: no mpirun '$mpirun'"; exit 77; }
WORK=$(mktemp -d)
trap 'pgrep -f "$WORK" | xargs -r kill -KILL 2>/dev/null; rm -rf "$WORK"' EXIT
fail() {
  echo "FAIL: $*" >&2
  for f in "$WORK"/*.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -25 "$f" >&2; }; done
  exit 1
}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 DDP_TIMEOUT_S=20 DDP_FLIGHT_DIR="$WORK/flight"
export DDP_TEST_SLOW_RANK=1:600000
start=$SECONDS
# timeout: mpirun must not outlive the test (ctest would kill only this shell).
timeout -k 5 100 "$mpirun" --allow-run-as-root --oversubscribe -np 2 \
  -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS -x DDP_TIMEOUT_S -x DDP_FLIGHT_DIR -x DDP_TEST_SLOW_RANK \
  "$train" --data synthetic --epochs 1 --loss-log "$WORK/run.loss" >"$WORK/mpirun.log" 2>&1 </dev/null
status=$?
[ $status -ne 0 ] && [ $status -ne 124 ] || fail "mpirun exited $status, expected the timeout's failure"
[ $((SECONDS - start)) -lt 90 ] || fail "the timeout took $((SECONDS - start)) s (DDP_TIMEOUT_S=20)"
grep -q "flight recorder: all_reduce #[0-9]* .*: wrote $WORK/flight/flight_rank_0.json" "$WORK/mpirun.log" ||
  fail "rank 0 did not say where its dump is"
[ -e "$WORK/flight/flight_rank_1.json" ] && fail "rank 1, stuck in its forward, left a dump"
"$ddprun" analyze "$WORK/flight" >"$WORK/analyze.log" 2>&1 || fail "ddprun analyze exited $?"
cat "$WORK/analyze.log"
grep -q "backend mpi" "$WORK/analyze.log" || fail "the dump is not the mpi backend's"
grep -qE "^  rank 1: no dump; no collective timed out or failed on it, so it most likely never entered all_reduce #[0-9]+ \(ddp bucket 0, [0-9.]+ KB\)" \
  "$WORK/analyze.log" || fail "analyze does not name rank 1 and the all_reduce"
grep -qE "^  every rank with a dump entered all_reduce #[0-9]+ \(ddp bucket 0, .*rank 0 (timed out in it|has waited)" \
  "$WORK/analyze.log" || fail "analyze does not say rank 0 waited in the all_reduce"

# SIGUSR1 under mpirun: both ranks dump, the job succeeds.
unset DDP_TEST_SLOW_RANK
export DDP_FLIGHT_DIR="$WORK/usr1"
timeout -k 5 100 "$mpirun" --allow-run-as-root --oversubscribe -np 2 \
  -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS -x DDP_FLIGHT_DIR \
  "$train" --data synthetic --epochs 30 --log-every 100000 --loss-log "$WORK/usr1.loss" \
  >"$WORK/usr1.log" 2>&1 </dev/null &
job=$!
deadline=$((SECONDS + 60))
until [ "$( (cat "$WORK/usr1.loss" 2>/dev/null || true) | wc -l)" -ge 50 ]; do
  [ $SECONDS -ge $deadline ] && fail "no training under mpirun within 60 s"
  sleep 0.05
done
ranks=$(pgrep -f -- "--loss-log $WORK/usr1.loss" | while read -r p; do
  [ "$(cat /proc/"$p"/comm 2>/dev/null)" = train ] && echo "$p"; done)
[ "$(echo "$ranks" | wc -w)" -eq 2 ] || fail "expected 2 train processes, found: $ranks"
kill -USR1 $ranks
wait $job || fail "the job that got SIGUSR1 exited $?"
"$ddprun" analyze "$WORK/usr1" >"$WORK/analyze_usr1.log" 2>&1 || fail "analyze of the SIGUSR1 dumps exited $?"
grep -q "^2 dumps of job" "$WORK/analyze_usr1.log" || fail "not 2 dumps after SIGUSR1"
echo "flight_mpirun: ok"
