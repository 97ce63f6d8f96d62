#!/usr/bin/env bash
# A checkpoint written by `train --save` loads into PyTorch: the safetensors header parses
# with plain Python (models/load_checkpoint.py), the metadata names the model, and the
# equivalent torch.nn.Sequential (models/torch_models.py) takes the model tensors with
# load_state_dict(strict=True); the optimizer tensors match the parameters' shapes.
# Exit code 77 (skip) with the reason when /usr/bin/python3 (or $PYTHON) cannot import torch.
# usage: checkpoint_torch_test.sh TRAIN_BINARY [extra train flags, e.g. --model cnn]
set -euo pipefail
train=$1
shift
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
. "$(dirname "${BASH_SOURCE[0]}")/lib_torch.sh"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$train" --data synthetic --epochs 1 --synthetic-size 2000 --quiet "$@" \
  --save "$dir/ck.safetensors"

"$python" - "$root/models" "$dir/ck.safetensors" <<'EOF'
import sys

sys.path.insert(0, sys.argv[1])
import torch
import load_checkpoint

path = sys.argv[2]
tensors, metadata = load_checkpoint.read_safetensors(path)
for key in ("format", "model", "optimizer", "epoch", "step", "seed", "lr"):
    assert key in metadata, f"metadata has no '{key}': {metadata}"
assert metadata["format"] == "ddp-train-v1", metadata
assert metadata["epoch"] == "1", metadata

model, _ = load_checkpoint.load_model(path)  # load_state_dict(strict=True) inside
params = list(model.parameters())
state = model.state_dict()
for name, t in tensors.items():
    if not name.startswith("optimizer."):
        assert torch.equal(state[name], t), f"{name} differs after loading"
momentum = [t for n, t in tensors.items() if n.startswith("optimizer.")]
assert len(momentum) == len(params), f"{len(momentum)} optimizer tensors, {len(params)} params"
for i, p in enumerate(params):
    buf = tensors[f"optimizer.{i}.momentum_buffer"]
    assert buf.shape == p.shape, f"optimizer.{i}: {list(buf.shape)} vs {list(p.shape)}"
with torch.no_grad():
    out = model.eval()(torch.randn(4, 1, 28, 28))
assert out.shape == (4, 10) and torch.isfinite(out).all(), out
print(f"checkpoint_torch: {metadata['model']} loaded into torch with strict=True "
      f"({len(state)} model tensors, {len(momentum)} optimizer tensors, "
      f"{sum(p.numel() for p in params)} parameters)")
EOF
