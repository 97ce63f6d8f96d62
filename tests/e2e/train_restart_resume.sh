#!/usr/bin/env bash
# Restarts that resume (docs/checkpoints.md, "Resuming"): a group of 2 ranks on shm,
# checkpointing every 4 steps; rank 1 SIGKILLs itself after step 22, mid-way
# through epoch 2 (DDP_TEST_KILL_AT, first attempt only); ddprun --max-restarts 1
# restarts the group, which resumes from step 20 with --resume auto. The final
# checkpoint must equal the uninterrupted run's bit for bit, and the metrics rows
# must be the same epochs, steps and losses, each once; the --loss-log file
# (unflushed rows of the killed attempt included) equals the uninterrupted one.
# The same with AdamW, a cosine schedule, --grad-accum 2 and --on-nonfinite skip
# with a NaN at step 5 (the skipped count survives the restart; the cosine spans
# the run's optimizer steps).
# Then: a replayed epoch's row is not written twice, rows beyond the checkpoint
# (a half line included) are cut back, a fresh start under --resume auto drops a
# dead attempt's rows, a checkpoint never replaces a newer one, and a fresh run
# over an existing checkpoint is refused up front.
# `quick` (e2e.train_restart_resume_quick, which CI's sanitizer phase runs in this
# test's place) leaves out the AdamW restart; e2e.train_resume_adamw still resumes
# AdamW there, and the first restart drives the same restart and resume.
# usage: train_restart_resume.sh DDPRUN TRAIN [quick]
set -uo pipefail
ddprun=$1 train=$2 quick=${3:-}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() {
  echo "train_restart_resume.sh: FAIL: $*" >&2
  for f in "$dir"/*.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -20 "$f" >&2; }; done
  exit 1
}
# 2000 samples / 2 ranks / batch 64: 16 steps per epoch, 32 in all.
common=(--backend shm --data synthetic --synthetic-size 2000 --epochs 2 --seed 5
  --lr-schedule constant --save-every 4)

"$ddprun" --standalone -n 2 "$train" "${common[@]}" --save "$dir/full.st" --metrics "$dir/full.jsonl" \
  --loss-log "$dir/full.loss" >"$dir/full.log" 2>&1 || fail "the uninterrupted run exited $?"
DDP_TEST_KILL_AT=1:22 "$ddprun" --standalone -n 2 --grace-period 2 --max-restarts 1 "$train" "${common[@]}" \
  --resume auto --save "$dir/part.st" --metrics "$dir/part.jsonl" --loss-log "$dir/part.loss" \
  >"$dir/part.log" 2>&1 || fail "the restarted run exited $?"
grep -q "no checkpoint at $dir/part.st yet: starting fresh" "$dir/part.log" || fail "no fresh start"
grep -q "restarting the group" "$dir/part.log" || fail "ddprun did not restart the group"
grep -q "resumed from $dir/part.st at step 20 (epoch 2, step 4 of it)" "$dir/part.log" ||
  fail "the restarted group did not resume from step 20"
cmp "$dir/full.st" "$dir/part.st" || fail "the final checkpoints differ"
cmp "$dir/full.loss" "$dir/part.loss" || fail "the --loss-log files differ: $(diff "$dir/full.loss" "$dir/part.loss" | head -5)"
python3 - "$dir/full.jsonl" "$dir/part.jsonl" <<'PY' || fail "metrics rows differ"
import json, sys
full, part = ([json.loads(l) for l in open(p)] for p in sys.argv[1:])
key = lambda rows: [(r["epoch"], r["step"], r["steps"], r["train_loss"], r["test_acc"]) for r in rows]
assert key(full) == [(1, 16, 16, key(full)[0][3], key(full)[0][4]), (2, 32, 16) + key(full)[1][3:]], key(full)
assert key(part) == key(full), f"resumed {key(part)} vs uninterrupted {key(full)}"
print("metrics rows (epoch, step, steps, train_loss, test_acc):", key(part))
PY
ls "$dir" | grep -q '\.tmp\.' && fail "temporary files left behind"
echo "restart: resumed mid-epoch, checkpoint identical ($(stat -c %s "$dir/full.st") bytes)"

if [ "$quick" != quick ]; then # (its body not indented: heredocs)
# AdamW, cosine, --grad-accum 2 (8 steps per epoch, 16 in all), skip with a NaN
# loss at step 5; rank 1 is killed after step 14, the group resumes from step 12.
adamw=(--backend shm --data synthetic --synthetic-size 2000 --epochs 2 --seed 5 --optimizer adamw
  --lr 0.001 --lr-schedule cosine --grad-accum 2 --on-nonfinite skip --save-every 4)
DDP_TEST_NAN_AT=1:5 "$ddprun" --standalone -n 2 "$train" "${adamw[@]}" --save "$dir/afull.st" \
  --metrics "$dir/afull.jsonl" --loss-log "$dir/afull.loss" >"$dir/afull.log" 2>&1 ||
  fail "the uninterrupted adamw run exited $?"
DDP_TEST_NAN_AT=1:5 DDP_TEST_KILL_AT=1:14 "$ddprun" --standalone -n 2 --grace-period 2 --max-restarts 1 \
  "$train" "${adamw[@]}" --resume auto --save "$dir/apart.st" --metrics "$dir/apart.jsonl" \
  --loss-log "$dir/apart.loss" >"$dir/apart.log" 2>&1 || fail "the restarted adamw run exited $?"
grep -q "resumed from $dir/apart.st at step 12 (epoch 2, step 4 of it)" "$dir/apart.log" ||
  fail "the restarted adamw group did not resume from step 12"
cmp "$dir/afull.st" "$dir/apart.st" || fail "the final adamw checkpoints differ"
cmp "$dir/afull.loss" "$dir/apart.loss" || fail "the adamw --loss-log files differ"
python3 - "$dir/afull.jsonl" "$dir/apart.jsonl" "$dir/apart.st" <<'PY' || fail "adamw metrics or schedule wrong"
import json, struct, sys
full, part = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
key = lambda rows: [(r["epoch"], r["step"], r["train_loss"], r["lr"], r["skipped_steps"]) for r in rows]
assert key(part) == key(full), f"resumed {key(part)} vs uninterrupted {key(full)}"
assert [r["step"] for r in full] == [8, 16] and [r["skipped_steps"] for r in full] == [1, 1], key(full)
# the last update is the 15th (one skipped): lr_at(14) = 0.001 * (1 + cos(pi * 14 / 16)) / 2
# = 3.8e-5; a cosine over 32 steps (micro-batches) would give 6.0e-4
assert full[1]["lr"] < 0.0001, f"the cosine does not reach ~0 at the run's end: lr {full[1]['lr']}"
blob = open(sys.argv[3], "rb").read()
(n,) = struct.unpack_from("<Q", blob)
meta = json.loads(blob[8:8 + n])["__metadata__"]
assert meta["skipped_steps"] == "1", meta
print("adamw rows (epoch, step, train_loss, lr, skipped):", key(part))
PY
echo "restart adamw/cosine/grad-accum 2/skip: checkpoint, loss log and metrics identical"
fi

# A replayed epoch: its checkpoint lost, epoch 2 runs again from the epoch-1
# checkpoint; the metrics file already has its row, which is not written again.
single=(--data synthetic --synthetic-size 1000 --seed 5 --lr-schedule constant --quiet)
"$train" "${single[@]}" --epochs 1 --save "$dir/e1.st" || fail "epoch 1 run exited $?"
cp "$dir/e1.st" "$dir/e1_copy.st"
"$train" "${single[@]}" --epochs 2 --resume "$dir/e1.st" --save "$dir/e1.st" --metrics "$dir/m.jsonl" \
  --loss-log "$dir/loss.txt" || fail "epoch 2 run exited $?"
cp "$dir/e1_copy.st" "$dir/e1.st"
"$train" "${single[@]}" --epochs 2 --resume "$dir/e1.st" --save "$dir/e1.st" --metrics "$dir/m.jsonl" \
  --loss-log "$dir/loss.txt" || fail "the replay exited $?"
[ "$(wc -l <"$dir/m.jsonl")" -eq 1 ] || fail "the replayed epoch's row was written again: $(cat "$dir/m.jsonl")"
[ "$(cut -d' ' -f1,2 "$dir/loss.txt" | sort | uniq -d | wc -l)" -eq 0 ] ||
  fail "--loss-log has replayed steps twice"

# Rows beyond the checkpoint, the last one cut in half (a kill mid-write), and a
# metrics row of a later step: the resumed run cuts them and writes its own, so
# the files equal an uninterrupted run's.
"$train" "${single[@]}" --epochs 2 --metrics "$dir/u.jsonl" --loss-log "$dir/u.loss" ||
  fail "the uninterrupted single run exited $?"
cp "$dir/e1_copy.st" "$dir/cut.st"
head -16 "$dir/u.loss" >"$dir/cut.loss"
head -1 "$dir/u.jsonl" >"$dir/cut.jsonl"
printf '2 1 0.5\n2 2 0.4\n2 3 0.3' >>"$dir/cut.loss"
echo '{"epoch": 2, "step": 40, "train_loss": 1.0}' >>"$dir/cut.jsonl"
"$train" "${single[@]}" --epochs 2 --resume "$dir/cut.st" --save "$dir/cut.st" --metrics "$dir/cut.jsonl" \
  --loss-log "$dir/cut.loss" || fail "the cut-back run exited $?"
cmp "$dir/u.loss" "$dir/cut.loss" || fail "rows beyond the checkpoint not cut back: $(tail -3 "$dir/cut.loss")"
[ "$(cut -c1-30 "$dir/u.jsonl")" = "$(cut -c1-30 "$dir/cut.jsonl")" ] ||
  fail "metrics rows beyond the checkpoint not cut back: $(cat "$dir/cut.jsonl")"
# A fresh start under --resume auto (an attempt died before its first checkpoint
# but after writing rows): its rows are not kept twice.
printf '1 1 2.5\n1 2 2.4\n' >"$dir/fresh.loss"
"$train" "${single[@]}" --epochs 2 --resume auto --save "$dir/fresh.st" --loss-log "$dir/fresh.loss" ||
  fail "the fresh --resume auto run exited $?"
cmp "$dir/u.loss" "$dir/fresh.loss" || fail "a dead attempt's rows were kept: $(head -3 "$dir/fresh.loss")"

# Another global batch at an epoch boundary rescales a cosine's span: refused.
"$train" --data synthetic --synthetic-size 1000 --seed 5 --epochs 2 --batch-size 32 --lr-schedule cosine \
  --resume "$dir/e1_copy.st" >"$dir/batch.log" 2>&1
[ $? -eq 1 ] || fail "a cosine resume with another global batch did not exit 1"
grep -q "written with a global batch of 64 (--batch-size x --grad-accum x ranks), this run has 32" \
  "$dir/batch.log" || fail "no message naming both global batches"

# Never older: e1.st is at step 32 now; resuming from the epoch-1 copy (step 16)
# with --save e1.st is refused before the first step, and e1.st is left alone.
cp "$dir/e1.st" "$dir/e2_copy.st"
"$train" "${single[@]}" --epochs 3 --resume "$dir/e1_copy.st" --save "$dir/e1.st" >"$dir/older.log" 2>&1
[ $? -eq 1 ] || fail "resuming into a newer --save did not exit 1"
grep -q "already holds a checkpoint at step 32 (epoch 2), later than this run's start (step 16" \
  "$dir/older.log" || fail "no never-older message"
cmp "$dir/e1.st" "$dir/e2_copy.st" || fail "the newer checkpoint was replaced"
# A fresh run (no --resume) over an existing checkpoint: the same, naming --resume auto.
"$train" "${single[@]}" --epochs 1 --save "$dir/e1.st" >"$dir/fresh.log" 2>&1
[ $? -eq 1 ] || fail "a fresh run over a checkpoint did not exit 1"
grep -q "pass --resume auto to continue from it" "$dir/fresh.log" || fail "no --resume auto hint"
! grep -q "^epoch 1/" "$dir/fresh.log" || fail "the refusal came after training"
echo "train_restart_resume: ok"
