#!/usr/bin/env bash
# train --save-best and --early-stop (Note [best so far] in trainer/epoch.cpp):
#   - a 12-epoch reference run writes its metrics; --save-best's checkpoint is the
#     step of the first row with the highest test_acc, with that value in its metadata;
#   - --early-stop 2 ends the run at the first epoch with 2 evaluations in a row
#     without a strictly better test_acc, as computed from the reference's rows,
#     its rows equal to the reference's up to there, and says so;
#   - the patience survives a resume: the same run stopped one epoch before that
#     point (where one evaluation without improvement is pending) and resumed with
#     --resume auto stops at the same epoch, not one later;
#   - under ddprun -n 2 with ZeRO-1 the best checkpoint holds the whole optimizer
#     state (gathered on every rank), as a one-process one does.
# usage: train_best.sh TRAIN DDPRUN SOURCE_DIR
set -uo pipefail
train=$1 ddprun=$2 source=$3
python=${PYTHON:-/usr/bin/python3}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "train_best.sh: FAIL: $*" >&2; exit 1; }
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
cd "$dir" || exit 1
# A constant rate: the resumed run's schedule must not depend on its --epochs.
common=(--data synthetic --synthetic-size 1000 --lr 0.01 --lr-schedule constant --seed 4 --device cpu)
run() { # NAME CMD...: runs CMD into NAME.log, failing the test when it fails
  local name=$1 rc=0
  shift
  "$@" >"$name.log" 2>&1 || rc=$?
  ((rc == 0)) || { tail -20 "$name.log" >&2; fail "$name: $* exited $rc"; }
}
meta() { # FILE KEY: a metadata value of a checkpoint, through the package's reader
  local listing
  listing=$("$python" "$source/python/ddp_checkpoint.py" "$1") || fail "ddp_checkpoint.py $1: $listing"
  sed -nE "s/^$2: //p" <<<"$listing"
}

run reference "$train" "${common[@]}" --epochs 12 --metrics ref.jsonl --save-best best.st
# The best row (the first of the highest), and where patience 2 stops.
read -r best best_step stop < <("$python" - ref.jsonl <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
best, best_step, since, stop = None, None, 0, 0
for i, r in enumerate(rows):
    if best is None or r["test_acc"] > best:
        best, best_step, since = r["test_acc"], r["step"], 0
    else:
        since += 1
        if since == 2 and stop == 0:
            stop = r["epoch"]
print(best, best_step, stop)
PY
)
[ "$(meta best.st step)" = "$best_step" ] ||
  fail "best.st is at step $(meta best.st step), the best row (test_acc $best) at step $best_step"
"$python" -c "import sys; sys.exit(abs($(meta best.st best_metric) - $best) > 1e-6)" ||
  fail "best.st's best_metric $(meta best.st best_metric) is not the best test_acc $best"
grep -q "best test_acc so far" reference.log || fail "no 'best so far' line"
echo "save-best: step $best_step, test_acc $best"
[ "$stop" -gt 1 ] || fail "the reference run never went 2 evaluations without improving: \
the test needs a run that does (change --lr or --seed)"

run stopped "$train" "${common[@]}" --epochs 12 --metrics stop.jsonl --early-stop 2
[ "$(wc -l <stop.jsonl)" -eq "$stop" ] ||
  fail "--early-stop 2 ran $(wc -l <stop.jsonl) epochs, the reference's rows say $stop"
cmp -s <(cut -d, -f1-4 stop.jsonl) <(head -n "$stop" ref.jsonl | cut -d, -f1-4) ||
  fail "the early-stopped run's rows differ from the reference's"
grep -q "^early stop: test_acc has not improved on its best .* in 2 evaluations" stopped.log ||
  fail "no early-stop line: $(tail -3 stopped.log)"
grep -q "stopped early (--early-stop)" stopped.log || fail "the summary does not say it stopped early"
echo "early stop: after epoch $stop, as the reference's rows say"

run part "$train" "${common[@]}" --epochs $((stop - 1)) --early-stop 2 --save part.st
run resumed "$train" "${common[@]}" --epochs 12 --early-stop 2 --save part.st --resume auto \
  --metrics resumed.jsonl
[ "$(meta part.st epoch)" = "$stop" ] ||
  fail "the resumed run ended at epoch $(meta part.st epoch), the uninterrupted one at $stop"
echo "resume: the pending evaluation without improvement was kept; stopped at epoch $stop again"

# After a resume the summary's best is the run's (the checkpoint's included), and a
# --save-best file this run never wrote (a stale one lies there) is not named: at
# lr 1e-30 no evaluation beats the checkpoint's best.
run lr_a "$train" "${common[@]}" --epochs 2 --save lr.st
echo stale >nb.st
run lr_b "$train" "${common[@]}" --lr 1e-30 --epochs 4 --resume lr.st --save lr.st --save-best nb.st
best=$(meta lr.st best_metric)
grep -q "(best $(printf '%.4f' "$best"))" lr_b.log ||
  fail "the summary's best is not the run's $best: $(grep summary lr_b.log)"
grep -q "no --save-best written" lr_b.log || fail "the summary names nb.st, never written: $(grep summary lr_b.log)"
[ "$(cat nb.st)" = stale ] || fail "nb.st was replaced by a run that never improved"
echo "resume: the summary's best is the run's ($best); an unwritten --save-best is not named"

run ddp "$ddprun" --standalone -n 2 "$train" "${common[@]}" --epochs 2 --zero 1 --save-best ddp_best.st
# The listing whole first: grep -q would close the pipe on the lister mid-print.
listing=$("$python" "$source/python/ddp_checkpoint.py" ddp_best.st) || fail "ddp_checkpoint.py: $listing"
shapes=$(grep -c "^  optimizer\..*momentum_buffer" <<<"$listing")
[ "$shapes" -eq 4 ] || fail "the ZeRO-1 best checkpoint has $shapes momentum buffers, expected 4"
grep -qF "optimizer.0.momentum_buffer float32 [256, 784]" <<<"$listing" ||
  fail "the ZeRO-1 best checkpoint lacks the whole first momentum buffer"
echo "ddprun -n 2 ZeRO-1: the best checkpoint holds the whole optimizer state"
