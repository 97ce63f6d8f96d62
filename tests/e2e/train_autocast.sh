#!/usr/bin/env bash
# train --precision bf16 under autocast (Note [autocast]) with every data-parallel
# engine, on CPU ranks (DDP_TEST_CPU_AUTOCAST=1: the CUDA path's rules, the CPU's
# widening kernels), as bench/gpu/run.sh checks them on one GPU:
#   - the run says "(bf16 autocast)" and its loss tracks fp32's (MLP within 2%);
#   - ddprun -n 1 ends with the one-process bf16 checkpoint exactly;
#   - ddprun -n 2 (shm, batch 32 per rank), ZeRO-2 over shm, and DataParallel over two
#     virtual devices each end near the one-process bf16 checkpoint (batch 64): no
#     further from it than twice the fp32 run is (tests/e2e/checkpoint_distance.py).
#     Half batches round their bf16 activations apart and a trajectory amplifies it,
#     so a fixed tolerance would be a guess; bf16's own distance from fp32 is the yardstick;
#   - gpt-tiny's loss under autocast tracks fp32's within 2%.
# usage: train_autocast.sh TRAIN DDPRUN E2E_DIR
set -uo pipefail
train=$1 ddprun=$2 e2e=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "train_autocast.sh: FAIL: $*" >&2; exit 1; }
export DDP_TEST_CPU_AUTOCAST=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
mlp=(--model mlp --data synthetic --synthetic-size 3200 --epochs 1 --max-steps 30
  --lr-schedule constant --seed 5 --device cpu)

run() { # NAME CMD...: runs CMD into NAME.log, failing the test when it fails
  local name=$1 rc=0
  shift
  "$@" >"$dir/$name.log" 2>&1 || rc=$?
  ((rc == 0)) || { tail -20 "$dir/$name.log" >&2; fail "$name: $* exited $rc"; }
}
last_loss() { sed -nE 's/.*"train_loss": ([0-9.eE+-]+).*/\1/p' "$1" | tail -1; }
close() { # A B TOL WHAT: |A - B| <= TOL * A
  python3 -c 'import sys; a, b, t = map(float, sys.argv[1:4]); sys.exit(0 if a > 0 and abs(a - b) <= t * a else 1)' \
    "$1" "$2" "$3" || fail "$4: $2 vs $1 (tolerance $3 relative)"
}

run fp32 "$train" "${mlp[@]}" --batch-size 64 --precision fp32 --metrics "$dir/fp32.json" \
  --save "$dir/fp32.safetensors"
run ref "$train" "${mlp[@]}" --batch-size 64 --precision bf16 --metrics "$dir/ref.json" \
  --save "$dir/ref.safetensors"
grep -q "(bf16 autocast)" "$dir/ref.log" || fail "the bf16 run does not say '(bf16 autocast)'"
close "$(last_loss "$dir/fp32.json")" "$(last_loss "$dir/ref.json")" 0.02 "mlp train_loss bf16 vs fp32"

check() { # NAME PATTERN CMD...: CMD saves NAME.safetensors, near ref's (see the top)
  local name=$1 pattern=$2
  shift 2
  run "$name" "$@" --save "$dir/$name.safetensors"
  grep -qE "$pattern" "$dir/$name.log" || fail "$name: the log does not show /$pattern/"
  local line
  line=$(python3 "$e2e/checkpoint_distance.py" "$dir/ref.safetensors" "$dir/$name.safetensors" \
    "$dir/fp32.safetensors") || fail "$name: $line"
  echo "$name: $line"
}
run ddp_w1 env DDP_BACKEND=shm "$ddprun" --standalone -n 1 "$train" "${mlp[@]}" --batch-size 64 \
  --precision bf16 --mode ddp --save "$dir/ddp_w1.safetensors"
python3 "$e2e/compare_checkpoints.py" "$dir/ref.safetensors" "$dir/ddp_w1.safetensors" --rtol 1e-6 \
  >"$dir/ddp_w1.compare" || { cat "$dir/ddp_w1.compare" >&2; fail "ddp_w1: differs from one process"; }
check ddp_shm_w2 "ddp over 2 ranks \(shm backend" env DDP_BACKEND=shm "$ddprun" --standalone -n 2 \
  "$train" "${mlp[@]}" --batch-size 32 --precision bf16
check zero2_shm_w2 "ddp over 2 ranks \(shm backend" env DDP_BACKEND=shm "$ddprun" --standalone -n 2 \
  "$train" "${mlp[@]}" --batch-size 32 --precision bf16 --zero 2
check dp_2devices "dp over 2 replicas" env DDP_VIRTUAL_CPU_DEVICES=2 "$train" "${mlp[@]}" \
  --batch-size 64 --precision bf16 --mode dp --devices cpu:0,cpu:1

gpt=(--model gpt-tiny --data synthetic --epochs 1 --max-steps 20 --seed 3 --device cpu)
run gpt_fp32 "$train" "${gpt[@]}" --metrics "$dir/gpt_fp32.json"
run gpt_bf16 "$train" "${gpt[@]}" --precision bf16 --metrics "$dir/gpt_bf16.json"
close "$(last_loss "$dir/gpt_fp32.json")" "$(last_loss "$dir/gpt_bf16.json")" 0.02 \
  "gpt-tiny train_loss bf16 vs fp32"
echo "train_autocast.sh: ok"
