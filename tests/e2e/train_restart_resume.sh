#!/usr/bin/env bash
# Restarts that resume (docs/checkpoints.md, "Resuming"): a group of 2 ranks on shm,
# checkpointing every 4 steps; rank 1 SIGKILLs itself after step 22, mid-way
# through epoch 2 (DDP_TEST_KILL_AT, first attempt only); ddprun --max-restarts 1
# restarts the group, which resumes from step 20 with --resume auto. The final
# checkpoint must equal the uninterrupted run's bit for bit, and the metrics rows
# must be the same epochs, steps and losses, each once.
# Then: a replayed epoch's row is not written twice, a checkpoint never replaces a
# newer one, and a fresh run over an existing checkpoint is refused up front.
# usage: train_restart_resume.sh DDPRUN TRAIN
set -uo pipefail
ddprun=$1 train=$2
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
  >"$dir/full.log" 2>&1 || fail "the uninterrupted run exited $?"
DDP_TEST_KILL_AT=1:22 "$ddprun" --standalone -n 2 --grace-period 2 --max-restarts 1 "$train" "${common[@]}" \
  --resume auto --save "$dir/part.st" --metrics "$dir/part.jsonl" >"$dir/part.log" 2>&1 ||
  fail "the restarted run exited $?"
grep -q "no checkpoint at $dir/part.st yet: starting fresh" "$dir/part.log" || fail "no fresh start"
grep -q "restarting the group" "$dir/part.log" || fail "ddprun did not restart the group"
grep -q "resumed from $dir/part.st at step 20 (epoch 2, step 4 of it)" "$dir/part.log" ||
  fail "the restarted group did not resume from step 20"
cmp "$dir/full.st" "$dir/part.st" || fail "the final checkpoints differ"
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
