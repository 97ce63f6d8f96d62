#!/usr/bin/env bash
# train --model gpt-tiny (docs/train.md, "Language models"), real processes:
#  1. one process, 100 steps on the Brown corpus: the loss falls (the first step's
#     near ln 256, a uniform guess's, the mean of the last 10 logged losses 1.5
#     nats below the first 10's), every metrics row carries val_loss, val_bpb = val_loss / ln 2,
#     tokens_per_s and the corpus entropies, one row per --eval-every and at the end;
#  2. ddprun -n 2 with --bucket-cap-mb 0.1: the header reports at least the 5 buckets
#     that 120,576 f32 gradients (0.46 MiB) need at 0.1 MiB each, and the final
#     weights after 12 steps equal (1e-3 relative) those of one process with the
#     same global batch (2 x 4 = 8 windows: the same windows, Note [text windows]),
#     but not those of one process with a batch of 4. The tolerance: the gradients
#     differ in rounding (two half-batch means averaged vs one mean), and AdamW's
#     m / sqrt(v) magnifies that where a gradient is near 0 (measured 1.7e-4 at most;
#     a batch of 4 instead of 8 differs by 5e-3 to 1.2); the validation losses (over
#     the same windows: 2 ranks x 2 batches x 4 = 2 batches x 8) agree to 1e-4
#     (rank 0's loss log holds its half-batch losses, so it cannot equal the
#     one-process log; the weights say more);
#  3. a restart mid-run: rank 1 killed after step 10, ddprun --max-restarts 1, the
#     group resumes from the step-8 checkpoint and ends with the uninterrupted
#     run's weights bit for bit, and the same evaluation rows (--eval-every 6:
#     steps 6, 12 and the end, 16), each once.
# Without the corpus it skips (77) unless DDP_REQUIRE_DATA=1 (deploy/test.sh).
# usage: train_gpt.sh DDPRUN TRAIN
set -uo pipefail
ddprun=$1 train=$2
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() {
  echo "train_gpt.sh: FAIL: $*" >&2
  for f in "$dir"/*.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -15 "$f" >&2; }; done
  exit 1
}
corpus=${DDP_BROWN_DIR:-/usr/share/datasets/brown}
if [ ! -f "$corpus/cats.txt" ]; then
  [ "${DDP_REQUIRE_DATA:-0}" = 1 ] && fail "the Brown corpus is not in $corpus (deploy/install-deps.sh)"
  echo "train_gpt.sh: skipped: no Brown corpus in $corpus (deploy/install-deps.sh installs it)"
  exit 77
fi

# 1. Loss falls; metrics.
"$train" --model gpt-tiny --max-steps 100 --batch-size 8 --lr 0.003 --eval-every 50 --device cpu \
  --loss-log "$dir/loss.txt" --metrics "$dir/m.jsonl" >"$dir/single.log" 2>&1 ||
  fail "train exited $?"
grep -q "bucket" "$dir/single.log" && fail "a single process reports buckets"
python3 - "$dir/loss.txt" "$dir/m.jsonl" <<'PY' || fail "loss or metrics wrong"
import json, math, sys
losses = [float(l.split()[2]) for l in open(sys.argv[1])]
assert len(losses) == 100, len(losses)
first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
assert abs(losses[0] - math.log(256)) < 0.3, f"the first step's loss {losses[0]} is not near ln 256"
assert last < first - 1.5, f"the loss did not fall: first 10 steps {first:.3f}, last 10 {last:.3f}"
rows = [json.loads(l) for l in open(sys.argv[2])]
assert [r["step"] for r in rows] == [50, 100], [r["step"] for r in rows]
for r in rows:
    assert r["grad_norm"] > 0, r  # clipping is on by default: its norm is reported
    for key in ("val_loss", "val_bpb", "tokens_per_s", "unigram_bits", "bigram_bits", "train_loss",
                "data_ms", "forward_ms", "backward_ms", "optimizer_ms"):
        assert key in r, f"metrics row lacks {key}: {r}"
    assert abs(r["val_bpb"] - r["val_loss"] / math.log(2)) < 1e-5, r
    assert r["tokens_per_s"] > 0 and 4.3 < r["unigram_bits"] < 4.6 and 3.4 < r["bigram_bits"] < 3.7, r
    assert "test_acc" not in r, r
assert rows[1]["val_loss"] < rows[0]["val_loss"] < math.log(256), rows
print(f"loss {first:.3f} -> {last:.3f}; val_loss {rows[0]['val_loss']:.4f} -> {rows[1]['val_loss']:.4f}")
PY

# 2. DDP: buckets, and parity with one process of the same global batch.
common=(--model gpt-tiny --max-steps 12 --seed 3 --eval-batches 2 --device cpu)
"$ddprun" --standalone -n 2 "$train" "${common[@]}" --backend shm --bucket-cap-mb 0.1 --batch-size 4 \
  --save "$dir/ddp.st" --metrics "$dir/ddp.jsonl" >"$dir/ddp.log" 2>&1 || fail "ddprun -n 2 train exited $?"
buckets=$(sed -nE 's/.*ddp over 2 ranks \([a-z]+ backend, ([0-9]+) bucket\(s\).*/\1/p' "$dir/ddp.log")
[ -n "$buckets" ] && [ "$buckets" -ge 5 ] || fail "expected >= 5 buckets at 0.1 MiB, the log says '$buckets'"
"$train" "${common[@]}" --batch-size 8 --save "$dir/one.st" --metrics "$dir/one.jsonl" >"$dir/one.log" 2>&1 ||
  fail "train exited $?"
"$train" "${common[@]}" --batch-size 4 --save "$dir/half.st" >"$dir/half.log" 2>&1 || fail "train exited $?"
python3 "$here/compare_checkpoints.py" "$dir/one.st" "$dir/ddp.st" --rtol 1e-3 >"$dir/cmp.log" 2>&1 ||
  fail "ddprun -n 2 x batch 4 differs from one process x batch 8: $(tail -3 "$dir/cmp.log")"
python3 "$here/compare_checkpoints.py" "$dir/half.st" "$dir/ddp.st" --rtol 1e-3 >/dev/null 2>&1 &&
  fail "the parity check cannot tell a batch of 4 from 8"
python3 - "$dir/one.jsonl" "$dir/ddp.jsonl" <<'PY' || fail "the validation losses differ"
import json, sys
one, ddp = ([json.loads(l)["val_loss"] for l in open(p)] for p in sys.argv[1:])
assert len(one) == len(ddp) == 1 and abs(one[0] - ddp[0]) <= 1e-4 * one[0], (one, ddp)
print(f"val_loss: one process {one[0]}, ddprun -n 2 {ddp[0]}")
PY
grep -q '"transformer.h.1.attn.c_attn.weight"' "$dir/ddp.st" || fail "no GPT-2 tensor names in the checkpoint"
echo "ddp: $buckets buckets; weights equal one process with the same global batch ($(tail -1 "$dir/cmp.log"))"

# 3. Restart and resume: bit for bit.
resume=(--model gpt-tiny --max-steps 16 --batch-size 4 --seed 5 --eval-batches 2 --save-every 4
  --eval-every 6 --backend shm --device cpu)
"$ddprun" --standalone -n 2 "$train" "${resume[@]}" --save "$dir/full.st" --metrics "$dir/full.jsonl" \
  >"$dir/full.log" 2>&1 || fail "the uninterrupted run exited $?"
DDP_TEST_KILL_AT=1:10 "$ddprun" --standalone -n 2 --grace-period 2 --max-restarts 1 "$train" \
  "${resume[@]}" --resume auto --save "$dir/part.st" --metrics "$dir/part.jsonl" >"$dir/part.log" 2>&1 ||
  fail "the restarted run exited $?"
grep -q "resumed from $dir/part.st at step 8 (epoch 1, step 8 of it)" "$dir/part.log" ||
  fail "the restarted group did not resume from step 8"
cmp "$dir/full.st" "$dir/part.st" || fail "the final checkpoints differ"
python3 - "$dir/full.jsonl" "$dir/part.jsonl" <<'PY' || fail "the metrics rows differ"
import json, sys
full, part = ([json.loads(l) for l in open(p)] for p in sys.argv[1:])
key = lambda rows: [(r["step"], r["train_loss"], r["val_loss"]) for r in rows]
assert [r["step"] for r in full] == [6, 12, 16], key(full)
assert key(part) == key(full), f"resumed {key(part)} vs uninterrupted {key(full)}"
print("evaluation rows (step, train_loss, val_loss), each once:", key(part))
PY
echo "train_gpt.sh: ok"
