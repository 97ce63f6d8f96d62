#!/usr/bin/env bash
# --clip-grad-norm takes effect (docs/train.md): gpt-tiny on the synthetic token
# stream with plain SGD at lr 1 (no momentum, no decay, constant lr). Clipped to
# a norm of 1e-8, 6 steps move each weight by at most 6e-8, so the validation loss
# after 6 steps equals the one after 1 step (to 1e-5); without clipping (0) the
# same steps change it by more than 0.01. Then the same under ddprun -n 2, where
# the clip acts on the all-reduced gradients.
# `quick` (e2e.train_clip_quick, which CI's sanitizer phase runs in this test's
# place): the ddprun -n 2 case alone (the clip of one process is the same call
# on gradients nobody all-reduced; unit.Optim* drive it too).
# usage: train_clip.sh DDPRUN TRAIN [quick]
set -uo pipefail
ddprun=$1 train=$2 quick=${3:-}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "train_clip.sh: FAIL: $*" >&2; exit 1; }
args=(--model gpt-tiny --data synthetic --optimizer sgd --momentum 0 --weight-decay 0 --lr 1
  --lr-schedule constant --batch-size 4 --eval-batches 2 --device cpu --quiet)
val_loss() {  # LAUNCH... -- FLAGS...: the val_loss of the run's last metrics row
  local m
  m=$(mktemp -p "$dir")
  "$@" --metrics "$m" >"$m.log" 2>&1 || { cat "$m.log" >&2; fail "$* exited $?"; }
  sed -nE 's/.*"val_loss": ([0-9.]+).*/\1/p' "$m" | tail -1
}
check() {  # NAME LAUNCH...
  local name=$1
  shift
  local c1 c6 u1 u6
  c1=$(val_loss "$@" "$train" "${args[@]}" --clip-grad-norm 1e-8 --max-steps 1)
  c6=$(val_loss "$@" "$train" "${args[@]}" --clip-grad-norm 1e-8 --max-steps 6)
  u1=$(val_loss "$@" "$train" "${args[@]}" --clip-grad-norm 0 --max-steps 1)
  u6=$(val_loss "$@" "$train" "${args[@]}" --clip-grad-norm 0 --max-steps 6)
  python3 - "$c1" "$c6" "$u1" "$u6" <<'PY' || fail "$name: clipping did not act (val_loss clipped $c1 -> $c6, unclipped $u1 -> $u6)"
import sys
c1, c6, u1, u6 = map(float, sys.argv[1:])
assert abs(c6 - c1) <= 1e-5, (c1, c6)
assert abs(u6 - u1) > 0.01, (u1, u6)
PY
  echo "$name: clipped val_loss $c1 -> $c6, unclipped $u1 -> $u6"
}
[ "$quick" = quick ] || check "one process" env
check "ddprun -n 2" "$ddprun" --standalone -n 2
echo "train_clip.sh: ok"
