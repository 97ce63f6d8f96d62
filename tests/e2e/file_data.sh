#!/usr/bin/env bash
# train --data on files NumPy and a CSV writer made (runtime/data/file_dataset.h):
#   - a CSV classification (header, label last) learns its rule: test_acc > 0.9;
#   - the same rows as an .npz (np.savez_compressed, x_test/y_test) and as a
#     directory of .npy files (big-endian float64 inputs, uint8 labels) give the
#     CSV's loss log exactly: one data set, three spellings;
#   - an .npz regression (2 outputs) reaches near the noise floor: its test_loss
#     (MSE) within 2x of least squares' own test MSE, computed by NumPy;
#   - under ddprun -n 2 with ZeRO-1, a run stopped after epoch 1 and resumed
#     (--resume auto) ends with the uninterrupted run's loss log and checkpoint;
#   - bad files get errors naming the file and what to do: a single .npy, a
#     Fortran-order array, a text value in the CSV, an unknown column.
# Skipped (77, reason printed) where /usr/bin/python3 cannot import numpy; the
# test command installs it (python3-torch depends on python3-numpy).
# usage: file_data.sh TRAIN DDPRUN
set -uo pipefail
train=$1 ddprun=$2
python=${PYTHON:-/usr/bin/python3}
if ! "$python" -c 'import numpy' >/dev/null 2>&1; then
  echo "SKIPPED: $python cannot import numpy (apt-get install python3-numpy)"
  exit 77
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "file_data.sh: FAIL: $*" >&2; exit 1; }
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
cd "$dir" || exit 1

"$python" - <<'PY' || fail "numpy could not write the files"
import os
import numpy as np
rng = np.random.default_rng(7)
n = 1200
x = rng.normal(size=(n, 4)).astype(np.float32)
label = ((x[:, 0] + x[:, 1] > 0).astype(np.int64) + (x[:, 2] > 0.8)).astype(np.int64)
# The CSV holds float32 values printed in full, so all three forms carry equal inputs.
with open("cls.csv", "w") as f:
    f.write("f0,f1,f2,f3,label\n")
    for row, y in zip(x, label):
        f.write(",".join(repr(float(v)) for v in row) + f",{y}\n")
# The held-out rows of the CSV (every 10th) as an explicit test set.
test = np.arange(n) % 10 == 9
np.savez_compressed("cls.npz", x=x[~test], y=label[~test], x_test=x[test], y_test=label[test])
os.makedirs("cls_dir")
np.save("cls_dir/x.npy", x[~test].astype(">f8"))
np.save("cls_dir/y.npy", label[~test].astype(np.uint8))
np.save("cls_dir/x_test.npy", x[test].astype(">f8"))
np.save("cls_dir/y_test.npy", label[test].astype(np.uint8))

w = rng.normal(size=(4, 2)).astype(np.float32)
y = (x @ w + 0.1 * rng.normal(size=(n, 2))).astype(np.float32)
np.savez("reg.npz", x=x[~test], y=y[~test], x_test=x[test], y_test=y[test])
xb = np.c_[x[~test], np.ones((~test).sum())]
coef = np.linalg.lstsq(xb, y[~test], rcond=None)[0]
mse = float(np.mean((np.c_[x[test], np.ones(test.sum())] @ coef - y[test]) ** 2))
open("lstsq_mse", "w").write(f"{mse}\n")

np.save("one.npy", x)
np.savez("fortran.npz", x=np.asfortranarray(x), y=label)
PY
printf 'a,b,label\n1,2,0\n3,high,1\n' >text.csv

run() { # NAME CMD...: runs CMD into NAME.log, failing the test when it fails
  local name=$1 rc=0
  shift
  "$@" >"$name.log" 2>&1 || rc=$?
  ((rc == 0)) || { tail -20 "$name.log" >&2; fail "$name: $* exited $rc"; }
}
field() { sed -nE "s/.*\"$2\": ([0-9.eE+-]+).*/\1/p" "$1" | tail -1; }
common=(--epochs 3 --lr 0.05 --seed 3 --device cpu)

run csv "$train" --data cls.csv "${common[@]}" --metrics csv.jsonl --loss-log csv.loss
grep -q "cls.csv/train (1080 train / 120 test: every 10th row held out)" csv.log ||
  fail "the CSV's header line: $(grep '^train:' csv.log)"
acc=$(field csv.jsonl test_acc)
"$python" -c "import sys; sys.exit(0 if $acc > 0.9 else 1)" || fail "CSV test_acc $acc <= 0.9"
run npz "$train" --data cls.npz "${common[@]}" --loss-log npz.loss
run npy_dir "$train" --data cls_dir "${common[@]}" --loss-log dir.loss
cmp -s csv.loss npz.loss || fail "the .npz's loss log differs from the CSV's"
cmp -s csv.loss dir.loss || fail "the .npy directory's loss log differs from the CSV's"
echo "classification: test_acc $acc; CSV, .npz and .npy directory give one loss log"

run reg "$train" --data reg.npz "${common[@]}" --epochs 6 --metrics reg.jsonl
grep -q "mlp 4-256-2 " reg.log || fail "the regression is not a 2-output mlp: $(grep '^train:' reg.log)"
grep -q "final test_loss" reg.log || fail "no test_loss in the summary: $(tail -1 reg.log)"
loss=$(field reg.jsonl test_loss)
floor=$(cat lstsq_mse)
"$python" -c "import sys; sys.exit(0 if $loss < 2 * $floor else 1)" ||
  fail "regression test_loss $loss is not within 2x of least squares' $floor"
echo "regression: test_loss $loss, least squares $floor"

# A constant rate: a cosine schedule spans the run, so a 1-epoch run would not be its first half.
ddp=(--data reg.npz --epochs 2 --lr 0.05 --lr-schedule constant --seed 3 --device cpu --zero 1
  --batch-size 32)
run whole "$ddprun" --standalone -n 2 "$train" "${ddp[@]}" --save whole.st --loss-log whole.loss
run first "$ddprun" --standalone -n 2 "$train" "${ddp[@]}" --epochs 1 --save part.st \
  --loss-log part.loss
run resumed "$ddprun" --standalone -n 2 "$train" "${ddp[@]}" --save part.st --resume auto \
  --loss-log part.loss
cmp -s whole.loss part.loss || fail "the resumed run's loss log differs from the whole run's"
cmp -s whole.st part.st || fail "the resumed run's checkpoint differs from the whole run's"
echo "ddprun -n 2, ZeRO-1: stopped after epoch 1 and resumed = the whole run"

expect_error() { # PATTERN CMD...: CMD fails and its output has PATTERN
  local pattern=$1 out
  shift
  out=$("$@" 2>&1) && fail "$* succeeded"
  grep -qF -- "$pattern" <<<"$out" || fail "$*: expected '$pattern' in: $out"
}
expect_error "one.npy: one .npy holds one array" "$train" --data one.npy
expect_error "np.ascontiguousarray" "$train" --data fortran.npz
expect_error "text.csv:3: column 'b' holds 'high'" "$train" --data text.csv
expect_error "no column 'y'; its columns are f0, f1, f2, f3, label" "$train" --data cls.csv \
  --target-columns y
expect_error "--task 'guess': valid values are auto, classify, regress" "$train" --data cls.csv \
  --task guess
expect_error "--test-data, --target-columns, --input-columns and --task need --data" "$train" \
  --data synthetic --task regress
echo "bad files: errors name the file and the fix"
