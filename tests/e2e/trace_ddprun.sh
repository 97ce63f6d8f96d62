#!/usr/bin/env bash
# trace_ddprun.sh DDPRUN TRAIN BACKEND: `ddprun -n 2 --trace DIR train` leaves a
# merged timeline, DIR/trace.json, that check_trace.py accepts: valid Chrome
# JSON, spans nested per track, as many steps on every rank as train ran,
# bucket all-reduces after their buckets became ready, and clocks aligned
# (rank 1's file reads as if its clock ran 3 s ahead: DDP_TRACE_TEST_SKEW_NS).
# The first run gets DIR from an exported DDP_TRACE: ddprun itself records
# nothing and writes no file of its own (nor does `ddprun --help` or
# `ddprun trace-merge` with DDP_TRACE set). Then: `ddprun trace-merge` merges the
# files again; a rank stopped by ddprun's SIGTERM still writes its file, with the
# spans it was in marked unfinished; a restarted group keeps the failed
# attempt's files next to the last one's, which is merged; trace-merge without
# traces or without DIR fails with exit 1 and 2.
set -uo pipefail
ddprun=$1 train=$2 backend=$3
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "trace_ddprun.sh: FAIL: $*" >&2; exit 1; }

# 1280 samples, batch 64, 2 ranks: 10 steps of 640 samples per rank.
out=$(DDP_TRACE="$work/t" DDP_TRACE_TEST_SKEW_NS=3000000000 "$ddprun" --standalone -n 2 \
        --backend "$backend" "$train" --data synthetic --synthetic-size 1280 --batch-size 64 \
        --epochs 1 --bucket-cap-mb 0.2 2>&1)
status=$?
printf '%s\n' "$out" | tail -5
[ "$status" -eq 0 ] || fail "ddprun exit code $status"
grep -q "ddprun: trace: merged 2 rank(s)" <<<"$out" || fail "ddprun did not say it merged 2 ranks"
[ -f "$work/t/rank_0.json" ] && [ -f "$work/t/rank_1.json" ] || fail "rank files missing"
# ddprun wrote no file of its own (a rank_0.json of run "" written at its exit).
listing=$(cd "$work/t" && ls | sort | tr '\n' ' ')
[ "$listing" = "rank_0.json rank_1.json trace.json " ] || fail "unexpected files in DIR: $listing"
python3 - "$work/t/rank_0.json" <<'PY' || fail "rank_0.json is not rank 0's file of the run"
import json, sys
f = json.load(open(sys.argv[1]))
sys.exit(0 if f["run_id"] and f["rank"] == 0 and f["events"] else 1)
PY
DDP_TRACE="$work/self" "$ddprun" --help >/dev/null || fail "ddprun --help"
DDP_TRACE="$work/self" "$ddprun" trace-merge "$work/t" --output "$work/self-merge.json" >/dev/null ||
  fail "trace-merge with DDP_TRACE set"
[ ! -e "$work/self" ] || fail "ddprun recorded itself into DDP_TRACE: $(ls "$work/self")"
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

# A restarted group: rank 1 kills itself after step 3 of the first attempt; that
# attempt's files stay (rank 0's, written on ddprun's SIGTERM), the second
# attempt writes rank_R_restart1.json, and that is what ddprun merges.
DDP_TEST_KILL_AT=1:3 "$ddprun" --standalone -n 2 --max-restarts 1 --backend "$backend" \
  --trace "$work/r" "$train" --data synthetic --synthetic-size 640 --batch-size 64 --epochs 1 \
  >"$work/r.log" 2>&1 || { tail -5 "$work/r.log"; fail "the restarted run failed"; }
[ -f "$work/r/rank_0.json" ] || fail "the failed attempt's file is gone: $(ls "$work/r")"
[ -f "$work/r/rank_0_restart1.json" ] && [ -f "$work/r/rank_1_restart1.json" ] ||
  fail "the restart's files are missing: $(ls "$work/r")"
grep -q "ddprun: trace: merged 2 rank(s)" "$work/r.log" || fail "no merge of the restart"
python3 "$here/check_trace.py" "$work/r/trace.json" --ranks 2 --steps 5 ||
  fail "the restart's trace is wrong"
# The failed attempt merges on request: rank 0's file, rank 1's missing (SIGKILL).
out=$("$ddprun" trace-merge "$work/r" --restart 0 --output "$work/r0.json") ||
  fail "trace-merge --restart 0 failed"
grep -q "merged 1 rank(s).*no trace from rank(s) 1" <<<"$out" || fail "trace-merge --restart 0: $out"
"$ddprun" trace-merge "$work/r" --restart last 2>/dev/null
[ $? -eq 2 ] || fail "trace-merge --restart last: expected exit 2"

"$ddprun" trace-merge "$work/empty-dir-that-is-not-there" 2>/dev/null
[ $? -eq 1 ] || fail "trace-merge of a missing directory: expected exit 1"
"$ddprun" trace-merge 2>/dev/null
[ $? -eq 2 ] || fail "trace-merge without DIR: expected exit 2"
echo "trace_ddprun.sh: ok ($backend)"
