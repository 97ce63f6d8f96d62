#!/usr/bin/env bash
# Note [checkpoint checksums] end to end: one flipped bit in a checkpoint's
# tensor bytes makes `train --resume` fail (exit 1) naming the tensor, instead
# of training on from damaged weights, and so does a flipped digit of its
# metadata's step (Note [metadata checksum]); the intact file resumes.
# usage: train_corrupt_checkpoint.sh TRAIN_BINARY
set -euo pipefail
train=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
common=(--data synthetic --synthetic-size 1000 --seed 3 --quiet --lr-schedule constant)
"$train" "${common[@]}" --epochs 1 --save "$dir/ck.safetensors"
python3 - "$dir/ck.safetensors" "$dir/bad.safetensors" <<'PY'
import sys
data = bytearray(open(sys.argv[1], "rb").read())
data[-100] ^= 0x01  # inside the last tensor's bytes
open(sys.argv[2], "wb").write(data)
PY
set +e
"$train" "${common[@]}" --epochs 2 --resume "$dir/bad.safetensors" > "$dir/out" 2>&1
rc=$?
set -e
cat "$dir/out"
[[ $rc == 1 ]] || { echo "expected exit 1 for a corrupted checkpoint, got $rc" >&2; exit 1; }
grep -q "tensor '.*' is corrupted: its [0-9]* bytes have CRC-32C" "$dir/out" ||
  { echo "the error does not name the corrupted tensor" >&2; exit 1; }
# Note [metadata checksum]: a flipped digit of the metadata's step (10 -> 11 here) is
# refused too, not resumed at another step.
python3 - "$dir/ck.safetensors" "$dir/step.safetensors" <<'PY'
import sys
data = bytearray(open(sys.argv[1], "rb").read())
at = data.index(b'"step":"')
data[at + 8] ^= 0x01  # the step's first digit
open(sys.argv[2], "wb").write(data)
PY
set +e
"$train" "${common[@]}" --epochs 2 --resume "$dir/step.safetensors" > "$dir/out" 2>&1
rc=$?
set -e
[[ $rc == 1 ]] || { cat "$dir/out"; echo "expected exit 1 for a damaged step, got $rc" >&2; exit 1; }
grep -q "its metadata (step, epoch, seed, ...) fails its checksum" "$dir/out" ||
  { cat "$dir/out"; echo "the damaged metadata is not named" >&2; exit 1; }
"$train" "${common[@]}" --epochs 2 --resume "$dir/ck.safetensors"
echo "train_corrupt_checkpoint: the damaged files were refused, the intact one resumed"
