#!/usr/bin/env bash
# train --cuda-graph's eager paths, on the CPU (DDP_TEST_CUDA_GRAPH_ON_CPU=1, Note
# [graphed steps] in trainer/epoch.cpp): every capture fails there, so the run warns
# once, naming why, and trains eagerly -- the 2 warm-up steps, the step whose capture
# failed (prepare_step() before it, apply_step() after) and the rest, with the
# gradients zeroed in place and a capturable optimizer (Note [captured optimizer
# steps]). Every step's loss and the checkpoint (weights and optimizer state) must be
# those of a run without the flag, bit for bit: SGD with momentum and a step schedule,
# and AdamW with a warmup, a cosine schedule and clipping, over two epochs (the second
# epoch's first step is not a capture again).
# usage: train_cuda_graph_fallback.sh TRAIN COMPARE_CHECKPOINTS_PY
set -euo pipefail
train=$1 compare=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "train_cuda_graph_fallback.sh: FAIL: $*" >&2; exit 1; }
common=(--data synthetic --synthetic-size 600 --epochs 2 --max-steps 8 --batch-size 32 --quiet --seed 7)
export DDP_DEVICE=cpu OMP_NUM_THREADS=1

case_no=0
for optimizer in "--optimizer sgd --momentum 0.9 --lr-schedule step" \
  "--optimizer adamw --lr-schedule cosine --warmup-steps 3 --clip-grad-norm 0.5"; do
  case_no=$((case_no + 1))
  read -r -a opt <<<"$optimizer"
  "$train" "${common[@]}" "${opt[@]}" --loss-log "$dir/plain$case_no.loss" --save "$dir/plain$case_no.safetensors" \
    >"$dir/plain.out" 2>&1 || { cat "$dir/plain.out" >&2; fail "case $case_no: the run without --cuda-graph exited $?"; }
  DDP_TEST_CUDA_GRAPH_ON_CPU=1 "$train" "${common[@]}" "${opt[@]}" --cuda-graph \
    --loss-log "$dir/graph$case_no.loss" --save "$dir/graph$case_no.safetensors" >"$dir/graph.out" 2>&1 ||
    { cat "$dir/graph.out" >&2; fail "case $case_no: the --cuda-graph run exited $?"; }
  warnings=$(grep -c "could not be captured" "$dir/graph.out" || true)
  [ "$warnings" -eq 1 ] || { cat "$dir/graph.out" >&2; fail "case $case_no: expected one capture warning, got $warnings"; }
  grep -q "step 3 could not be captured (CudaGraph::capture on cpu" "$dir/graph.out" ||
    { cat "$dir/graph.out" >&2; fail "case $case_no: the warning should name step 3 and the reason"; }
  [ "$(wc -l <"$dir/plain$case_no.loss")" -eq 16 ] || fail "case $case_no: expected 16 logged steps"
  cmp -s "$dir/plain$case_no.loss" "$dir/graph$case_no.loss" ||
    { diff "$dir/plain$case_no.loss" "$dir/graph$case_no.loss" >&2 || true; fail "case $case_no ($optimizer): the losses differ"; }
  python3 "$compare" "$dir/plain$case_no.safetensors" "$dir/graph$case_no.safetensors" --rtol 0 >"$dir/cmp.out" 2>&1 ||
    { cat "$dir/cmp.out" >&2; fail "case $case_no ($optimizer): the checkpoints differ"; }
  grep -q identical "$dir/cmp.out" || { cat "$dir/cmp.out" >&2; fail "case $case_no: checkpoints not identical"; }
  echo "case $case_no ($optimizer): 16 losses and the checkpoint identical with and without --cuda-graph"
done
echo "train_cuda_graph_fallback.sh: ok"
