#!/usr/bin/env bash
# own_model.sh CMAKE BUILD_DIR SOURCE_DIR CXX GENERATOR: a program of one's own
# (examples/own_model: a model and a loss, nothing else) built against the
# installed package, on a CSV it was not written for, gets what train has
# (examples/own_data builds against it too):
#   - ddprun -n 2 with ZeRO-1 trains it (test_loss falls; the header names its model);
#   - a run stopped after 2 epochs and resumed (--resume auto) ends with the whole
#     run's loss log and checkpoint;
#   - the installed scale sweeps it (--program, weak scaling over 1 and 2 ranks):
#     two CSV rows of its own name with samples/s;
#   - train's zoo flags are refused by name (--model).
set -uo pipefail
cmake=$1 build=$2 source=$3 cxx=$4 generator=$5
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "own_model.sh: FAIL: $*" >&2; exit 1; }
run() { # NAME CMD...: quiet on success, the log on failure
  local name=$1 rc=0
  shift
  "$@" >"$work/$name.log" 2>&1 || rc=$?
  ((rc == 0)) || { tail -30 "$work/$name.log" >&2; fail "$name: $* exited $rc"; }
}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
prefix=$work/prefix
t0=$SECONDS
run install "$cmake" --install "$build" --prefix "$prefix"
run configure "$cmake" -S "$source/examples/own_model" -B "$work/own" -G "$generator" \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix"
run build "$cmake" --build "$work/own"
own=$work/own/own_model
[ -x "$own" ] || fail "examples/own_model did not build"
echo "installed and built examples/own_model against the package in $((SECONDS - t0)) s"
# examples/own_data builds against the package too (its run is e2e.own_data's, from the tree).
run configure_own_data "$cmake" -S "$source/examples/own_data" -B "$work/own_data" -G "$generator" \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix"
run build_own_data "$cmake" --build "$work/own_data"
run own_data_help "$work/own_data/own_data" --help

# y = sin(a) + 0.5 b - c^2 / 4 on 600 rows; awk's fixed seed makes the file the same each run.
awk 'BEGIN { srand(11); print "a,b,c,y";
  for (i = 0; i < 600; i++) { a = 4 * rand() - 2; b = 4 * rand() - 2; c = 4 * rand() - 2;
    printf "%.6f,%.6f,%.6f,%.6f\n", a, b, c, sin(a) + 0.5 * b - c * c / 4 } }' >"$work/table.csv"
cd "$work" || exit 1
ddprun=$prefix/bin/ddprun
flags=(--data table.csv --lr 0.02 --lr-schedule constant --batch-size 16 --zero 1 --device cpu)
run whole "$ddprun" --standalone -n 2 "$own" "${flags[@]}" --epochs 4 --save whole.st \
  --loss-log whole.loss --metrics whole.jsonl
grep -qE "^\[rank 0\] own_model: skipnet \[3\] -> 1 \([0-9]+ parameters\) on cpu, table.csv/train \(540 train / 60 test: every 10th row held out\)" whole.log ||
  fail "the header line does not name the program, its model and data: $(grep 'own_model:' whole.log)"
grep -q "ZeRO-1" whole.log || fail "not ZeRO-1: $(grep 'train:' whole.log)"
first=$(sed -nE 's/.*"test_loss": ([0-9.]+).*/\1/p' whole.jsonl | head -1)
last=$(sed -nE 's/.*"test_loss": ([0-9.]+).*/\1/p' whole.jsonl | tail -1)
awk -v a="$last" -v b="$first" 'BEGIN { exit !(a < 0.8 * b) }' ||
  fail "test_loss did not fall by a fifth: $first -> $last"
echo "ddprun -n 2, ZeRO-1: test_loss $first -> $last"

run part "$ddprun" --standalone -n 2 "$own" "${flags[@]}" --epochs 2 --save part.st \
  --loss-log part.loss
run resumed "$ddprun" --standalone -n 2 "$own" "${flags[@]}" --epochs 4 --save part.st \
  --resume auto --loss-log part.loss
cmp -s whole.loss part.loss || fail "the resumed run's loss log differs from the whole run's"
cmp -s whole.st part.st || fail "the resumed run's checkpoint differs from the whole run's"
echo "resume: stopped after epoch 2 and resumed = the whole run"

run scale "$prefix/bin/scale" --program "$own" --world-sizes 1,2 --scaling weak --batch 16 \
  --steps 5 --csv sweep.csv -- --data table.csv --lr-schedule constant --device cpu
rows=$(grep -c "^ours,own_model,weak," sweep.csv)
[ "$rows" -eq 2 ] || fail "scale wrote $rows rows of own_model, expected 2: $(cat sweep.csv)"
echo "scale --program: $(grep -c . sweep.csv) lines in the CSV, 2 points of own_model"

out=$("$own" --model cnn 2>&1)
status=$?
if [ $status -ne 2 ] ||
  ! grep -qF -- "--model chooses a model of the zoo; own_model trains its own (skipnet)" <<<"$out"; then
  fail "--model was not refused by name (exit $status): $out"
fi
echo "own_model.sh: ok"
