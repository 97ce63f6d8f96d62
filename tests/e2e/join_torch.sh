#!/usr/bin/env bash
# train --drop-last false against PyTorch 1.13's DDP + Join (tests/e2e/join_torch.py):
# from the same initial weights (a train checkpoint written by torch, loaded with
# --resume) on a tiny Fashion-MNIST-format set, the same uneven shares (our
# sampler's Philox order, reimplemented in Python), batches, SGD and Join mode,
# the final weights agree to rtol 1e-5 per tensor (max |ours - torch| / max
# |torch|; float32 summation order differs, measured about 3e-7):
#   A  2 ranks, 41 samples, batches of 4: 6 and 5 steps, momentum 0.9, 1 epoch,
#      divide by the world size (ddprun, shm) and by the ranks that train (gloo);
#      the two modes' results differ, so the comparison tells them apart
#   B  3 ranks, 38 samples, --grad-accum 2: 2, 2 and 1 steps (no_sync), 2 epochs,
#      momentum 0, divide by the ranks that train (mpirun when given, else ddprun)
#   C  A over 2 epochs: ours equals one process that applies each step's average to
#      one model and optimizer (join_torch.py simulate); PyTorch's joined rank does
#      not step its optimizer, so its momentum goes stale and it does not (printed for
#      the record only: that comparison never fails the test).
# Skipped (77, reason printed) where /usr/bin/python3 (or $PYTHON) cannot import torch.
# usage: join_torch.sh DDPRUN TRAIN MPIRUN|none
set -uo pipefail
ddprun=$1 train=$2 mpirun=$3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/lib_torch.sh"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() {
  echo "join_torch.sh: FAIL: $*" >&2
  for f in "$dir"/*.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -20 "$f" >&2; }; done
  exit 1
}
limit=120
py() { timeout $limit "$python" "$here/join_torch.py" "$@"; }
rtol=1e-5

mkdir "$dir/a" "$dir/b"
py prepare "$dir/a" --train 41 --hidden 32 >"$dir/prepare.log" 2>&1 || fail "prepare a"
py prepare "$dir/b" --train 38 --hidden 32 >>"$dir/prepare.log" 2>&1 || fail "prepare b"
ours() {  # ours DATA OUT LAUNCHER... -- TRAIN FLAGS
  local data=$1 out=$2
  shift 2
  local launcher=()
  while [ "$1" != -- ]; do launcher+=("$1"); shift; done
  shift
  timeout $limit "${launcher[@]}" "$train" --data "$data" --model mlp --hidden 32 --batch-size 4 \
    --lr 0.05 --lr-schedule constant --resume "$data/init.st" --drop-last false --save "$out" "$@" \
    >"$out.log" 2>&1 || fail "$(basename "$out"): train exited $?"
}

a=(--world 2 --batch 4 --accum 1 --epochs 1 --lr 0.05 --momentum 0.9 --hidden 32)
for divide in world active; do
  py torch "$dir/a" "$dir/torch_a_$divide.st" "${a[@]}" --divide $divide >"$dir/torch_a_$divide.log" 2>&1 ||
    fail "torch a $divide"
done
ours "$dir/a" "$dir/ours_a_world.st" "$ddprun" --standalone -n 2 -- --epochs 1 --momentum 0.9
ours "$dir/a" "$dir/ours_a_active.st" "$ddprun" --standalone -n 2 -- --epochs 1 --momentum 0.9 \
  --backend gloo --join-divide active
for divide in world active; do
  echo "A, divide by $divide:"
  py compare "$dir/ours_a_$divide.st" "$dir/torch_a_$divide.st" --rtol $rtol ||
    fail "A ($divide): ours and PyTorch's Join differ"
done
echo "A, ours dividing by the world size against PyTorch dividing by the ranks that train:"
py compare "$dir/ours_a_world.st" "$dir/torch_a_active.st" --rtol $rtol --expect-differ ||
  fail "A: the two divide modes give the same weights, so the comparison cannot tell them apart"

b=(--world 3 --batch 4 --accum 2 --epochs 2 --lr 0.05 --momentum 0 --hidden 32 --divide active)
py torch "$dir/b" "$dir/torch_b.st" "${b[@]}" >"$dir/torch_b.log" 2>&1 || fail "torch b"
if [ "$mpirun" != none ]; then
  launcher=("$mpirun" --allow-run-as-root --oversubscribe -np 3)
else
  launcher=("$ddprun" --standalone -n 3)
fi
ours "$dir/b" "$dir/ours_b.st" "${launcher[@]}" -- --grad-accum 2 --epochs 2 --momentum 0 \
  --join-divide active
grep -q "ranks take 1 to 2 steps per epoch" "$dir/ours_b.st.log" || fail "B: not 1 to 2 steps"
echo "B (${launcher[0]##*/}), --grad-accum 2, divide by the ranks that train:"
py compare "$dir/ours_b.st" "$dir/torch_b.st" --rtol $rtol || fail "B: ours and PyTorch's Join differ"

c=(--world 2 --batch 4 --accum 1 --epochs 2 --lr 0.05 --momentum 0.9 --hidden 32 --divide world)
py simulate "$dir/a" "$dir/sim_c.st" "${c[@]}" >"$dir/sim_c.log" 2>&1 || fail "simulate c"
ours "$dir/a" "$dir/ours_c.st" "$ddprun" --standalone -n 2 -- --epochs 2 --momentum 0.9
echo "C, 2 epochs with momentum, ours against one process applying each step's average:"
py compare "$dir/ours_c.st" "$dir/sim_c.st" --rtol $rtol || fail "C: ours and the simulation differ"
py torch "$dir/a" "$dir/torch_c.st" "${c[@]}" >"$dir/torch_c.log" 2>&1 || fail "torch c"
echo "C, PyTorch (its joined rank's momentum goes stale) against the same, for the record only"
echo "  (informational: printed, never fails the test):"
py compare "$dir/torch_c.st" "$dir/sim_c.st" --rtol $rtol --expect-differ | tail -1
echo "join_torch: ok"
