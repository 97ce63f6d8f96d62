#!/usr/bin/env bash
# Resuming gives exactly the uninterrupted run: train 2 epochs in one go, and 1 epoch
# then --resume for the second; the two final checkpoints must be byte-identical
# (same parameters, optimizer state and metadata). The schedule is constant: a
# cosine or step schedule depends on --epochs, which differs between the runs.
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
echo "train_resume: checkpoints identical ($(stat -c %s "$dir/full.safetensors") bytes)"
