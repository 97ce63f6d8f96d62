#!/usr/bin/env bash
# own_data.sh OWN_DATA DDPRUN: a program whose data comes from no file
# (examples/own_data: two spirals generated in memory, a UserData, and a tanh
# MLP of its own) gets what train has:
#   - one process learns the spirals (test_acc >= 0.9; the header names its data,
#     under the program's name, as --help does);
#   - ddprun -n 2 with ZeRO-1 stopped after 2 epochs and resumed (--resume auto)
#     ends with the checkpoint of the run that never stopped;
#   - flags that name data to read are refused by name (--data), as --model is.
set -uo pipefail
own=$1 ddprun=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() {
  echo "own_data.sh: FAIL: $*" >&2
  for f in "$work"/*.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -15 "$f" >&2; }; done
  exit 1
}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
# A constant lr: a run of 2 epochs then resumed to 4 follows the 4-epoch run exactly.
common=(--optimizer adamw --lr 0.01 --lr-schedule constant --batch-size 32 --synthetic-size 2000 --device cpu)

"$own" "${common[@]}" --epochs 8 --metrics "$work/one.jsonl" >"$work/one.log" 2>&1 || fail "own_data exited $?"
grep -qF "spirals/train (2000 train / 400 test)" "$work/one.log" || fail "the header does not name the data"
grep -q "tanh-mlp \[2\] -> 2" "$work/one.log" || fail "the header does not name the model"
grep -q "^own_data: tanh-mlp" "$work/one.log" || fail "the header is not under the program's name"
"$own" --help >"$work/help.log" 2>&1 || fail "--help exited $?"
grep -q "^usage: own_data \[options\]" "$work/help.log" || fail "--help is not under the program's name"
grep -q "own_data reads its own data (spirals); --data, --test-data, --task" "$work/help.log" || fail "--help does not say the data is its own"
python3 - "$work/one.jsonl" <<'PY' || fail "the spirals were not learnt"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 8 and rows[-1]["test_acc"] >= 0.9, [r["test_acc"] for r in rows]
print(f"test_acc {rows[0]['test_acc']:.3f} -> {rows[-1]['test_acc']:.3f}")
PY

"$ddprun" --standalone -n 2 "$own" "${common[@]}" --epochs 4 --zero 1 --backend shm \
  --save "$work/whole.st" >"$work/whole.log" 2>&1 || fail "ddprun -n 2 own_data exited $?"
"$ddprun" --standalone -n 2 "$own" "${common[@]}" --epochs 2 --zero 1 --backend shm \
  --save "$work/part.st" >"$work/part1.log" 2>&1 || fail "the first half exited $?"
"$ddprun" --standalone -n 2 "$own" "${common[@]}" --epochs 4 --zero 1 --backend shm \
  --save "$work/part.st" --resume auto >"$work/part2.log" 2>&1 || fail "the resumed half exited $?"
grep -q "resum" "$work/part2.log" || fail "the second half did not resume"
cmp -s "$work/whole.st" "$work/part.st" || fail "the resumed run's checkpoint differs from the whole run's"

out=$("$own" --data x.csv 2>&1) && fail "own_data accepted --data"
grep -qF -- "--data names data to read; own_data reads its own (spirals)" <<<"$out" || fail "--data: $out"
# Named as refused before train's own checks of them ("--task classify needs --data").
for flag in "--task classify" "--test-data x.csv" "--target-columns a" "--task=regress"; do
  # shellcheck disable=SC2086 # the flag and its value
  out=$("$own" $flag 2>&1) && fail "own_data accepted $flag"
  grep -qF -- "${flag%%[ =]*} names data to read; own_data reads its own (spirals)" <<<"$out" ||
    fail "$flag: $out"
done
echo "own_data.sh: PASS"
