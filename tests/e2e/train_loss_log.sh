#!/usr/bin/env bash
# --loss-log (docs/train.md): one "epoch step loss" line per optimizer step, whose
# mean over an epoch is that epoch's train_loss in --metrics; under ddprun only
# rank 0 writes it. bench/gpu/run.sh compares such logs of a CPU and a CUDA run.
# usage: train_loss_log.sh DDPRUN TRAIN
set -euo pipefail
ddprun=$1 train=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "train_loss_log.sh: FAIL: $*" >&2; exit 1; }
args=(--data synthetic --synthetic-size 600 --epochs 2 --max-steps 7 --batch-size 32 --device cpu --quiet)

"$train" "${args[@]}" --loss-log "$dir/loss.txt" --metrics "$dir/m.jsonl" >"$dir/out" 2>&1 ||
  { cat "$dir/out" >&2; fail "train exited $?"; }
[ "$(wc -l <"$dir/loss.txt")" -eq 14 ] || fail "expected 14 lines (2 epochs x 7 steps), got: $(cat "$dir/loss.txt")"
python3 - "$dir/loss.txt" "$dir/m.jsonl" <<'PY' || fail "the logged losses do not match the metrics"
import json, sys
rows = [line.split() for line in open(sys.argv[1])]
epochs = [json.loads(line) for line in open(sys.argv[2])]
for e in epochs:
    steps = [(int(s), float(l)) for ep, s, l in rows if int(ep) == e["epoch"]]
    assert [s for s, _ in steps] == list(range(1, 8)), f"epoch {e['epoch']}: steps {steps}"
    mean = sum(l for _, l in steps) / len(steps)
    assert abs(mean - e["train_loss"]) <= 1e-5 * max(1.0, abs(mean)), \
        f"epoch {e['epoch']}: mean of the logged losses {mean} vs train_loss {e['train_loss']}"
    print(f"epoch {e['epoch']}: mean of 7 logged losses {mean:.6f} = train_loss {e['train_loss']:.6f}")
PY

# Under ddprun only rank 0 writes: rank 1 would append to the same file.
"$ddprun" --standalone -n 2 "$train" "${args[@]}" --loss-log "$dir/ddp.txt" >"$dir/out" 2>&1 ||
  { cat "$dir/out" >&2; fail "ddprun -n 2 train exited $?"; }
[ "$(wc -l <"$dir/ddp.txt")" -eq 14 ] || fail "ddprun -n 2: expected 14 lines, got $(wc -l <"$dir/ddp.txt")"
echo "train_loss_log.sh: ok"
