#!/usr/bin/env bash
# Resuming gives exactly the uninterrupted run: train 2 epochs in one go, and 1 epoch
# then --resume for the second; the two final checkpoints must be byte-identical
# (same parameters, optimizer state and metadata). The schedule is constant: a
# cosine or step schedule depends on --epochs, which differs between the runs. A
# checkpoint from the middle of an epoch refuses a training set of another size
# (and, under --drop-last false, another global batch), and any checkpoint data of
# another task.
# usage: train_resume.sh TRAIN_BINARY [extra train flags...]
set -euo pipefail
train=$1
shift
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
common=(--data synthetic --synthetic-size 2000 --seed 3 --quiet --lr-schedule constant "$@")
"$train" "${common[@]}" --epochs 2 --save "$dir/full.safetensors"
"$train" "${common[@]}" --epochs 1 --save "$dir/part.safetensors"
"$train" "${common[@]}" --epochs 2 --resume "$dir/part.safetensors" --save "$dir/part.safetensors"
cmp "$dir/full.safetensors" "$dir/part.safetensors"
ls "$dir" | grep -q tmp && { echo "temporary files left behind" >&2; exit 1; }
# A checkpoint from the middle of an epoch resumes only on the data it was cut from:
# a training set of another size has another order (samples repeated or skipped).
DDP_TEST_KILL_AT=0:15 "$train" "${common[@]}" --epochs 1 --save "$dir/mid.safetensors" \
  --save-every 10 >/dev/null 2>&1 && { echo "the run was not killed at step 15" >&2; exit 1; }
if out=$("$train" "${common[@]}" --synthetic-size 1500 --epochs 1 \
  --resume "$dir/mid.safetensors" 2>&1); then
  echo "a mid-epoch checkpoint resumed on a training set of another size: $out" >&2
  exit 1
fi
grep -q "stopped in the middle of epoch 1 on a training set of 2000 .* this run's has 1500" \
  <<<"$out" || { echo "the data change is not named: $out" >&2; exit 1; }
# A resume that plans the schedule over more steps (--epochs 2 after 1) says where
# the lr moves (it went back up from 0 unannounced).
if [ $# -eq 0 ]; then
  "$train" --data synthetic --synthetic-size 500 --seed 3 --epochs 1 --save "$dir/cos.st" >/dev/null
  out=$("$train" --data synthetic --synthetic-size 500 --seed 3 --epochs 2 --resume "$dir/cos.st")
  grep -q "note: --lr-schedule cosine spanned 8 optimizer steps in the checkpoint's run and spans 16 in this one" \
    <<<"$out" || { echo "the new span is not noted: $out" >&2; exit 1; }
fi
# ... and not with a --max-steps that ends the epoch before its step (it blamed a
# change of the global batch, then trained no step).
if out=$("$train" "${common[@]}" --epochs 1 --max-steps 5 --resume "$dir/mid.safetensors" 2>&1); then
  echo "a checkpoint at step 10 of its epoch resumed under --max-steps 5: $out" >&2
  exit 1
fi
grep -q "stopped after step 10 of epoch 1, and --max-steps 5 ends every epoch before that step" \
  <<<"$out" || { echo "--max-steps is not named: $out" >&2; exit 1; }
# --drop-last false (uneven shares, which start at an epoch's start only): a
# mid-epoch checkpoint resumes at its own global batch; another one is named (it
# failed in the sampler with an internal message).
DDP_TEST_KILL_AT=0:15 "$train" "${common[@]}" --epochs 1 --drop-last false \
  --save "$dir/uneven.safetensors" --save-every 10 >/dev/null 2>&1 &&
  { echo "the --drop-last false run was not killed at step 15" >&2; exit 1; }
if out=$("$train" "${common[@]}" --epochs 1 --drop-last false --batch-size 32 \
  --resume "$dir/uneven.safetensors" 2>&1); then
  echo "a --drop-last false mid-epoch checkpoint resumed at another global batch: $out" >&2
  exit 1
fi
grep -q "global batch of 64 .* this run has --seed 3 and 32, so its data order differs" <<<"$out" ||
  { echo "the --drop-last false batch change is not named: $out" >&2; exit 1; }
# A checkpoint of one task does not resume on data of another (Note [best so far]:
# its best test_acc would be read as a test_loss): regression targets, x.npy and
# y.npy of the synthetic set's shape written here without NumPy.
if [ $# -eq 0 ]; then
  mkdir "$dir/reg"
  python3 - "$dir/reg" <<'PY'
import random, struct, sys
def npy(path, shape, values):
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, %d), }" % shape
    header += " " * (63 - len(header) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode())
        f.write(struct.pack("<%df" % len(values), *values))
random.seed(1)
npy(sys.argv[1] + "/x.npy", (64, 784), [random.random() for _ in range(64 * 784)])
npy(sys.argv[1] + "/y.npy", (64, 10), [random.random() for _ in range(64 * 10)])
PY
  if out=$("$train" --data "$dir/reg" --seed 3 --epochs 2 --resume "$dir/full.safetensors" 2>&1); then
    echo "a classification checkpoint resumed on regression data: $out" >&2
    exit 1
  fi
  grep -q "the checkpoint's task is classification and this run's is regression" <<<"$out" ||
    { echo "the change of task is not named: $out" >&2; exit 1; }
fi
echo "train_resume: checkpoints identical ($(stat -c %s "$dir/full.safetensors") bytes)"
