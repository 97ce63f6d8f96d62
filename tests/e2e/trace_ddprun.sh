#!/usr/bin/env bash
# trace_ddprun.sh DDPRUN TRAIN BACKEND: `ddprun -n 2 --trace DIR train` leaves a
# merged timeline, DIR/trace.json, that check_trace.py accepts: valid Chrome
# JSON, spans nested per track, as many steps on every rank as train ran,
# bucket all-reduces after their buckets became ready, and clocks aligned
# (rank 1's file reads as if its clock ran 3 s ahead: DDP_TRACE_TEST_SKEW_NS).
# Then: `ddprun trace-merge` merges the files again; a rank stopped by ddprun's
# SIGTERM still writes its file, with the spans it was in marked unfinished;
# trace-merge without traces or without DIR fails with exit 1 and 2.
set -uo pipefail
ddprun=$1 train=$2 backend=$3
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "trace_ddprun.sh: FAIL: $*" >&2; exit 1; }

# 1280 samples, batch 64, 2 ranks: 10 steps of 640 samples per rank.
out=$(DDP_TRACE_TEST_SKEW_NS=3000000000 "$ddprun" --standalone -n 2 --backend "$backend" \
        --trace "$work/t" "$train" --data synthetic --synthetic-size 1280 --batch-size 64 \
        --epochs 1 --bucket-cap-mb 0.2 2>&1)
status=$?
printf '%s\n' "$out" | tail -5
[ "$status" -eq 0 ] || fail "ddprun exit code $status"
grep -q "ddprun: trace: merged 2 rank(s)" <<<"$out" || fail "ddprun did not say it merged 2 ranks"
[ -f "$work/t/rank_0.json" ] && [ -f "$work/t/rank_1.json" ] || fail "rank files missing"
python3 "$here/check_trace.py" "$work/t/trace.json" --ranks 2 --steps 10 --buckets ||
  fail "the merged trace is wrong"
grep -q "${backend} comm thread\|\"main\"" "$work/t/trace.json" || fail "no thread names"

# The subcommand merges the same files again.
"$ddprun" trace-merge "$work/t" --output "$work/again.json" || fail "trace-merge failed"
python3 "$here/check_trace.py" "$work/again.json" --ranks 2 --steps 10 --buckets ||
  fail "trace-merge's trace is wrong"

# SIGTERM to ddprun: the ranks get it, write their files, ddprun merges.
"$ddprun" --standalone -n 2 --backend "$backend" --trace "$work/s" "$train" --data synthetic \
  --synthetic-size 4000 --epochs 1000 --log-every 1 >"$work/s.log" 2>&1 &
pid=$!
for _ in $(seq 1 400); do
  grep -q "step 20/" "$work/s.log" 2>/dev/null && break
  sleep 0.05
done
grep -q "step 20/" "$work/s.log" || { kill -KILL $pid; fail "no progress before SIGTERM"; }
kill -TERM $pid
wait $pid
status=$?
[ "$status" -eq 143 ] || fail "ddprun after SIGTERM: exit $status, expected 143"
grep -q "ddprun: trace: merged 2 rank(s)" "$work/s.log" || fail "no merge after SIGTERM"
grep -q '"unfinished": 1' "$work/s/trace.json" || fail "no unfinished span after SIGTERM"
# A rank may have begun one more step than the other when the signal came.
python3 "$here/check_trace.py" "$work/s/trace.json" --ranks 2 --step-slack 1 ||
  fail "the trace after SIGTERM is wrong"

"$ddprun" trace-merge "$work/empty-dir-that-is-not-there" 2>/dev/null
[ $? -eq 1 ] || fail "trace-merge of a missing directory: expected exit 1"
"$ddprun" trace-merge 2>/dev/null
[ $? -eq 2 ] || fail "trace-merge without DIR: expected exit 2"
echo "trace_ddprun.sh: ok ($backend)"
