#!/usr/bin/env bash
# train --precision bf16 (Note [cpu bf16]): the MLP for 400 steps and the CNN for
# 100 steps on Fashion-MNIST reach a training loss within 1% (MLP) and 2% (CNN) of
# the fp32 run with the same seed, and say that they multiply in bf16 (a whole
# epoch of each is in docs/benchmarks.md; these lengths keep the ASan build's run
# short). On a CPU
# without AVX512_BF16 oneDNN emulates bf16 (DDP_TEST_BF16_EMULATE=1 lets train do it).
# usage: train_precision.sh TRAIN
set -uo pipefail
train=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "train_precision.sh: FAIL: $*" >&2; exit 1; }
export DDP_TEST_BF16_EMULATE=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
train_loss() {  # NAME FLAGS...: the run's last train_loss
  local name=$1
  shift
  local rc=0
  "$train" --device cpu --epochs 1 --lr-schedule constant --metrics "$dir/$name.json" "$@" \
    >"$dir/$name.log" 2>&1 || rc=$?
  ((rc == 0)) || { cat "$dir/$name.log" >&2; fail "$name: train $* exited $rc"; }
  sed -nE 's/.*"train_loss": ([0-9.eE+-]+).*/\1/p' "$dir/$name.json" | tail -1
}
compare() {  # MODEL TOLERANCE FLAGS...
  local model=$1 tol=$2
  shift 2
  local f32 b16
  f32=$(train_loss "$model-fp32" --model "$model" --precision fp32 "$@")
  b16=$(train_loss "$model-bf16" --model "$model" --precision bf16 "$@")
  grep -q "(bf16 matmuls)" "$dir/$model-bf16.log" || fail "$model: the bf16 run does not say so"
  grep -q "(bf16 matmuls)" "$dir/$model-fp32.log" && fail "$model: the fp32 run says bf16"
  python3 - "$f32" "$b16" "$tol" <<'PY' || fail "$model: bf16 train_loss $b16 vs fp32 $f32 (tolerance $tol relative)"
import sys
f32, b16, tol = map(float, sys.argv[1:])
assert f32 > 0 and abs(b16 - f32) <= tol * f32, (f32, b16)
assert b16 != f32, "bf16 gave the fp32 loss exactly: did it multiply in bf16?"
PY
  echo "$model: train_loss fp32 $f32, bf16 $b16"
}
compare mlp 0.01 --max-steps 400
compare cnn 0.02 --max-steps 100
echo "train_precision.sh: ok"
