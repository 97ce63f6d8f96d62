#!/usr/bin/env bash
# train --drop-last false (Note [uneven epochs] in trainer/uneven.h): ranks with
# different batch counts finish, no hang, under ddprun on shm and gloo and under
# mpirun, with the same weights on every backend; the metrics count every rank's
# real samples; a shadowed step is no step for the flight recorder's marks (the
# straggler report counts 4 to 6); --grad-accum, where a rank that shadows a step
# leaves its left-over micro-batch out of the samples counted; a rank killed while
# it shadows and the group resumed mid-epoch ends bit for bit as the uninterrupted
# run; --on-nonfinite skip; a gpt model with a partial last batch and evaluations
# inside the epoch; --max-steps that evens the counts runs without a Join; a rank
# without a sample (4 ranks, 3 samples). PyTorch parity: join_torch.sh; the
# timeline of an uneven run: train_join_trace.sh.
# usage: train_join.sh DDPRUN TRAIN MPIRUN|none
set -uo pipefail
ddprun=$1 train=$2 mpirun=$3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() {
  echo "train_join.sh: FAIL: $*" >&2
  for f in "$dir"/*.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -20 "$f" >&2; }; done
  exit 1
}
# A generous bound: each run takes a second or two; a hang would wait for the
# collective timeout (DDP_TIMEOUT_S, 300 s by default).
limit=120

# 97 samples over 3 ranks: 33, 32, 32; batches of 16: 3, 2, 2 (rank 0's third holds 1).
mlp=(--data synthetic --synthetic-size 97 --batch-size 16 --epochs 2 --seed 3 --drop-last false
  --lr-schedule constant)
for backend in shm gloo; do
  timeout $limit "$ddprun" --standalone -n 3 "$train" "${mlp[@]}" --backend $backend \
    --save "$dir/$backend.st" --metrics "$dir/$backend.jsonl" >"$dir/$backend.log" 2>&1 ||
    fail "ddprun -n 3 ($backend) exited $?"
  grep -q "ranks take 2 to 3 steps per epoch; a rank out of data joins" "$dir/$backend.log" ||
    fail "$backend: no line saying the ranks take 2 to 3 steps"
  # Step marks: rank 0 trains 3 steps per epoch, ranks 1 and 2 train 2 and shadow 1.
  grep -q "ddprun: straggler report (ranks 0-2, over 4-6 steps, uneven shares" "$dir/$backend.log" ||
    fail "$backend: the straggler report does not count 4 to 6 steps (shadowed steps marked?)"
done
python3 - "$dir/shm.jsonl" <<'PY' || fail "metrics"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [(r["epoch"], r["step"], r["steps"]) for r in rows] == [(1, 3, 3), (2, 6, 3)], rows
for r in rows:
    # samples_per_s x training time: every rank's real samples (97), not rank 0's x 3 (99).
    samples = r["samples_per_s"] * r["step_ms"] * r["steps"] / 1000
    assert abs(samples - 97) < 0.5, f"epoch {r['epoch']}: {samples:.2f} samples counted, not 97"
print("metrics: 3 steps per epoch, 97 samples each")
PY
python3 "$here/compare_checkpoints.py" "$dir/shm.st" "$dir/gloo.st" --rtol 1e-5 >/dev/null ||
  fail "shm and gloo end with different weights"
if [ "$mpirun" != none ]; then
  timeout $limit "$mpirun" --allow-run-as-root --oversubscribe -np 3 "$train" "${mlp[@]}" \
    --save "$dir/mpi.st" >"$dir/mpi.log" 2>&1 || fail "mpirun -np 3 exited $?"
  grep -q "ddp over 3 ranks (mpi backend" "$dir/mpi.log" || fail "mpirun: not the mpi backend"
  python3 "$here/compare_checkpoints.py" "$dir/shm.st" "$dir/mpi.st" --rtol 1e-5 >/dev/null ||
    fail "shm and mpi end with different weights"
fi
echo "uneven: shm, gloo$([ "$mpirun" != none ] && echo ", mpi") finish with the same weights"

# --grad-accum 2: 81 samples over 2 ranks, batches of 8: 6 and 5, so 3 and 2 steps
# (rank 1's fifth micro-batch is left over, as for any rank).
# Rank 0's 6th batch holds 1 sample: 3 steps of 16 + 16 + 9 and 2 of 16 + 16 = 73
# samples trained on per epoch, not 81.
timeout $limit "$ddprun" --standalone -n 2 "$train" --data synthetic --synthetic-size 81 \
  --batch-size 8 --grad-accum 2 --epochs 2 --drop-last false --join-divide active \
  --metrics "$dir/accum.jsonl" >"$dir/accum.log" 2>&1 || fail "--grad-accum 2 exited $?"
grep -q "ranks take 2 to 3 steps per epoch.*sum / their count" "$dir/accum.log" ||
  fail "--grad-accum 2: no line saying 2 to 3 steps"
python3 - "$dir/accum.jsonl" <<'PY' || fail "--grad-accum 2: metrics"
import json, sys
for r in (json.loads(l) for l in open(sys.argv[1])):
    samples = r["samples_per_s"] * r["step_ms"] * r["steps"] / 1000
    assert abs(samples - 73) < 0.5, f"epoch {r['epoch']}: {samples:.2f} samples counted, not 73"
print("--grad-accum 2: 73 samples per epoch")
PY

# Rank 1 (2 steps per epoch) is killed after global step 3, a step it shadowed; the
# group restarts and resumes from step 2's checkpoint, where rank 1 is out of data.
resume=("${mlp[@]}" --epochs 3 --backend shm --save-every 1 --resume auto)
timeout $limit "$ddprun" --standalone -n 3 "$train" "${mlp[@]}" --epochs 3 --save "$dir/full.st" \
  >"$dir/full.log" 2>&1 || fail "the uninterrupted run exited $?"
DDP_TEST_KILL_AT=1:3 timeout $limit "$ddprun" --standalone -n 3 --grace-period 2 --max-restarts 1 \
  "$train" "${resume[@]}" --save "$dir/part.st" >"$dir/part.log" 2>&1 ||
  fail "the restarted run exited $?"
grep -q "resumed from $dir/part.st at step 2 (epoch 1, step 2 of it)" "$dir/part.log" ||
  fail "the restarted group did not resume from step 2"
cmp "$dir/full.st" "$dir/part.st" || fail "the resumed run's checkpoint differs from the uninterrupted"
echo "uneven: resumed mid-epoch with a joined rank, checkpoint identical"

# skip: its per-step all_reduce runs on the shadowing ranks too.
timeout $limit "$ddprun" --standalone -n 3 "$train" "${mlp[@]}" --on-nonfinite skip \
  >"$dir/skip.log" 2>&1 || fail "--on-nonfinite skip exited $?"

# A gpt: 16130 windows of 65 bytes over 3 ranks: 5377, 5377, 5376; batches of 256:
# 22, 22, 21 (the 22nd holds 1 window); evaluations every 10 steps inside the epoch.
timeout $limit "$ddprun" --standalone -n 3 "$train" --model gpt:layers=1,d=16,heads=2,ctx=64 \
  --data synthetic --batch-size 256 --drop-last false --eval-every 10 --eval-batches 1 \
  --metrics "$dir/gpt.jsonl" >"$dir/gpt.log" 2>&1 || fail "gpt exited $?"
grep -q "ranks take 21 to 22 steps per epoch" "$dir/gpt.log" || fail "gpt: not 21 to 22 steps"
[ "$(wc -l <"$dir/gpt.jsonl")" -eq 3 ] || fail "gpt: expected 3 evaluations (steps 10, 20, 22)"

# --max-steps 2 evens the counts: no Join.
timeout $limit "$ddprun" --standalone -n 3 "$train" "${mlp[@]}" --max-steps 2 >"$dir/max.log" 2>&1 ||
  fail "--max-steps 2 exited $?"
grep -q "every rank takes 2 steps per epoch (no Join)" "$dir/max.log" || fail "--max-steps 2: a Join"
# A rank without a sample: 3 training samples over 4 ranks, 1 each and none for
# rank 3, which shadows the one step of each epoch; 2 test samples, none for ranks
# 2 and 3. Every rank finishes and the metrics count 3 samples per epoch.
mkdir "$dir/tiny"
python3 - "$dir/tiny" <<'PY' || fail "writing the tiny data set"
import gzip, os, struct, sys
for prefix, n in (("train", 3), ("t10k", 2)):
    with gzip.open(os.path.join(sys.argv[1], f"{prefix}-images-idx3-ubyte.gz"), "wb") as f:
        f.write(struct.pack(">IIII", 0x803, n, 28, 28) + bytes((7 * i) % 256 for i in range(n * 784)))
    with gzip.open(os.path.join(sys.argv[1], f"{prefix}-labels-idx1-ubyte.gz"), "wb") as f:
        f.write(struct.pack(">II", 0x801, n) + bytes(range(n)))
PY
timeout $limit "$ddprun" --standalone -n 4 "$train" --data "$dir/tiny" --batch-size 2 --epochs 2 \
  --drop-last false --metrics "$dir/tiny.jsonl" >"$dir/tiny.log" 2>&1 ||
  fail "4 ranks over 3 samples exited $?"
grep -q "ranks take 0 to 1 steps per epoch" "$dir/tiny.log" || fail "tiny: not 0 to 1 steps"
python3 - "$dir/tiny.jsonl" <<'PY' || fail "tiny: metrics"
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [(r["epoch"], r["steps"]) for r in rows] == [(1, 1), (2, 1)], rows
for r in rows:
    samples = r["samples_per_s"] * r["step_ms"] * r["steps"] / 1000
    assert abs(samples - 3) < 0.05, f"epoch {r['epoch']}: {samples:.2f} samples counted, not 3"
    assert math.isfinite(r["train_loss"]) and 0 <= r["test_acc"] <= 1, r
print("tiny: a rank without samples shadows; 3 samples per epoch")
PY
echo "train_join: ok"
