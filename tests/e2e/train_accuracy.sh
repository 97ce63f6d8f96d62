#!/usr/bin/env bash
# Runs train for EPOCHS epochs: the summary's final test accuracy must reach MIN_ACC,
# and --metrics must hold one JSON object per epoch with the documented keys.
# usage: train_accuracy.sh TRAIN_BINARY MIN_ACC EPOCHS [extra train flags...]
set -euo pipefail
train=$1 min_acc=$2 epochs=$3
shift 3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$train" --epochs "$epochs" --metrics "$dir/m.jsonl" "$@" | tee "$dir/out"
acc=$(sed -n 's/.*final test_acc \([0-9.]*\).*/\1/p' "$dir/out")
[ -n "$acc" ] || { echo "no summary line" >&2; exit 1; }
awk -v a="$acc" -v m="$min_acc" 'BEGIN { if (a + 0 < m + 0) { print "test_acc " a " below " m; exit 1 } }'
lines=$(wc -l < "$dir/m.jsonl")
[ "$lines" -eq "$epochs" ] || { echo "metrics has $lines lines, expected $epochs" >&2; exit 1; }
for key in epoch train_loss test_acc samples_per_s step_ms world_size; do
  grep -q "\"$key\": " "$dir/m.jsonl" || { echo "metrics lack $key" >&2; exit 1; }
done
echo "train_accuracy: test_acc $acc >= $min_acc, metrics ok"
