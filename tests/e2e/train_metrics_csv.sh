#!/usr/bin/env bash
# train --metrics FILE.csv (Note [metrics csv] in trainer/run_log.cpp):
#   - the CSV's header and cells hold the JSON lines' keys and values of the same
#     run (two identical single-process runs; then ddprun -n 2, whose list
#     columns are quoted), read back by Python's csv module;
#   - --resume cuts rows beyond the checkpoint (here a planted one) and keeps the
#     header; appending rows of other columns is an error naming both headers.
# usage: train_metrics_csv.sh TRAIN DDPRUN
set -uo pipefail
train=$1 ddprun=$2
python=${PYTHON:-/usr/bin/python3}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "train_metrics_csv.sh: FAIL: $*" >&2; exit 1; }
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
cd "$dir" || exit 1
common=(--data synthetic --synthetic-size 600 --epochs 2 --seed 2 --device cpu
  --lr-schedule constant)
run() { # NAME CMD...: runs CMD into NAME.log, failing the test when it fails
  local name=$1 rc=0
  shift
  "$@" >"$name.log" 2>&1 || rc=$?
  ((rc == 0)) || { tail -20 "$name.log" >&2; fail "$name: $* exited $rc"; }
}
# The columns whose values do not depend on timing must agree exactly.
same() { # CSV JSONL
  "$python" - "$1" "$2" <<'PY' || fail "$1 and $2 disagree"
import csv, json, sys
rows = list(csv.DictReader(open(sys.argv[1])))
lines = [json.loads(l) for l in open(sys.argv[2])]
assert len(rows) == len(lines) > 0, (len(rows), len(lines))
for r, j in zip(rows, lines):
    assert list(r) == list(j), (list(r), list(j))
    for k in ("epoch", "step", "train_loss", "test_acc", "lr", "steps", "world_size", "mode"):
        assert str(j[k]) == r[k] or float(j[k]) == float(r[k]), (k, j[k], r[k])
    if "rank_compute_ms" in j:
        assert json.loads(r["rank_compute_ms"]) and len(json.loads(r["rank_wait_ms"])) == 2, r
PY
}
run csv "$train" "${common[@]}" --metrics m.csv --save m.st
run json "$train" "${common[@]}" --metrics m.jsonl
same m.csv m.jsonl
run ddp_csv "$ddprun" --standalone -n 2 "$train" "${common[@]}" --metrics d.csv
run ddp_json "$ddprun" --standalone -n 2 "$train" "${common[@]}" --metrics d.jsonl
same d.csv d.jsonl
echo "CSV rows = JSON lines (one process, and ddprun -n 2 with quoted lists)"

# A row beyond the checkpoint (as a killed run leaves) is cut on resume; the header stays.
planted=$(tail -1 m.csv | sed 's/^2,/3,/; s/^\(3\),\([0-9]*\),/\1,999,/')
echo "$planted" >>m.csv
run resumed "$train" "${common[@]}" --epochs 3 --metrics m.csv --save m.st --resume auto
grep -q "^cut 1 --metrics and 0 --loss-log rows" resumed.log ||
  fail "the resume did not report cutting the planted row: $(head -3 resumed.log)"
[ "$(grep -c '^epoch,step,' m.csv)" -eq 1 ] || fail "the header is not there exactly once"
[ "$(wc -l <m.csv)" -eq 4 ] || fail "expected the header and 3 rows: $(cat m.csv)"
grep -q ",999," m.csv && fail "the planted row beyond the checkpoint survived"
echo "resume: the planted row cut, one header"

out=$("$train" --data synthetic --synthetic-size 600 --epochs 1 --max-steps 2 --metrics d.csv 2>&1) &&
  fail "rows of other columns were appended: $out"
grep -qF -- "--metrics d.csv: the file's header names the columns" <<<"$out" ||
  fail "the column mismatch is not named: $out"
echo "other columns: refused, naming both headers"
