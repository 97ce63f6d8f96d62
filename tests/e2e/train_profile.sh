#!/usr/bin/env bash
# train --profile-steps (docs/profile.md, Note [profiled steps] in trainer/run.h) on the
# mlp: the window, its table, and where it starts and ends:
# - 3 steps from step 3: each weight's update and each layer's gradients once a step;
# - a run that ends, or a checkpoint that follows, inside the window cuts it short
#   and says so;
# - --cuda-graph moves the start past the capture (step 3), here through the CPU
#   test hook whose capture fails;
# - a resumed run never profiles its own first 2 steps;
# - a run that ends before the window says that nothing was profiled.
# usage: train_profile.sh TRAIN_BINARY
set -euo pipefail
train=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAILED: $*" >&2; exit 1; }
run() { "$train" --data synthetic --synthetic-size 2000 --epochs 1 "$@" 2>&1; }
expect() {  # expect NAME PATTERN OUTPUT: OUTPUT matches the extended regex PATTERN
  grep -Ezq -- "$2" <<<"$3" || { printf '%s\n' "$3"; fail "$1: no match for /$2/"; }
  echo "ok: $1"
}

out=$(run --profile-steps 3)
expect "three steps" \
  "profile: steps 3-5 \(3 steps of [0-9.]+ ms; docs/profile.md\).*sgd_update \(cpu\) +f32\[256, 784\] f32\[256, 784\] f32\[256, 784\] +3 .*by op:.*linear_param_grads \(cpu\) +6 .*epoch 1/1" \
  "$out"

out=$(run --max-steps 4 --profile-steps 5)
expect "the epoch ends inside the window" \
  "profile: steps 3-4 \(2 steps of [0-9.]+ ms, cut short of 5; docs/profile.md\).*profile: cut short after step 4: the epoch ended.*epoch 1/1" \
  "$out"

out=$(run --save-every 4 --save "$dir/ck.st" --profile-steps 5)
expect "a checkpoint follows inside the window" \
  "profile: steps 3-4 \(2 steps of [0-9.]+ ms, cut short of 5;.*cut short after step 4: a checkpoint follows" \
  "$out"

out=$(DDP_TEST_CUDA_GRAPH_ON_CPU=1 run --cuda-graph --profile-steps 2)
expect "--cuda-graph starts after the capture" \
  "step 3 could not be captured.*profile: steps 4-5 \(2 steps of" "$out"

run --max-steps 10 --save "$dir/resume.st" --quiet >/dev/null
out=$("$train" --data synthetic --synthetic-size 2000 --epochs 2 --max-steps 10 \
  --resume "$dir/resume.st" --profile-steps 2 2>&1)
expect "a resumed run skips its first 2 steps" \
  "resumed from .* at step 10 .*profile: steps 13-14 \(2 steps of" "$out"

out=$(run --max-steps 4 --profile-steps 2 --profile-start 9)
expect "the run ends before the window" \
  "profile: nothing profiled: the run ended after step 4, before the first step --profile-steps may take \(9;" \
  "$out"
