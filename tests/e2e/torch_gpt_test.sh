#!/usr/bin/env bash
# ddp's GPT configs (models/gpt_config.h, printed by gpt_tensors) and the PyTorch
# reference model (models/torch_gpt.py) agree: for each config the torch model's
# state_dict has the same tensor names, order and shapes, and the same parameter count
# (gpt2: 124,439,808). Then for gpt-tiny: `torch_gpt.py init` writes safetensors that load
# back with strict=True, the initialisation has GPT-2's statistics, the loss at
# initialisation is about ln(vocab), and the attention is causal.
# Exit code 77 (skip) with the reason when /usr/bin/python3 (or $PYTHON) cannot import torch.
# usage: torch_gpt_test.sh GPT_TENSORS_BINARY
set -euo pipefail
gpt_tensors=$1
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
. "$(dirname "${BASH_SOURCE[0]}")/lib_torch.sh"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

for model in gpt-tiny gpt-mini gpt2 gpt:layers=3,d=48,heads=6,ctx=17,vocab=91; do
  "$gpt_tensors" "$model" >"$dir/cpp.json"
  "$python" "$root/models/torch_gpt.py" tensors --model "$model" >"$dir/torch.json"
  "$python" - "$model" "$dir/cpp.json" "$dir/torch.json" <<'PY'
import json, math, sys
model, cpp, torch_ = sys.argv[1], json.load(open(sys.argv[2])), json.load(open(sys.argv[3]))
assert cpp["model"] == torch_["model"], (cpp["model"], torch_["model"])
ours = [(t["name"], t["shape"]) for t in cpp["tensors"]]
theirs = [(t["name"], t["shape"]) for t in torch_["tensors"]]
for i, (a, b) in enumerate(zip(ours, theirs)):
    assert a == b, f"{model}: tensor {i} is {a} in C++ but {b} in torch"
assert len(ours) == len(theirs), f"{model}: {len(ours)} tensors in C++, {len(theirs)} in torch"
total = sum(math.prod(s) for _, s in theirs)
assert cpp["parameters"] == torch_["parameters"] == total, (cpp["parameters"], torch_["parameters"], total)
if model == "gpt2":
    assert total == 124_439_808, total
print(f"torch_gpt: {model}: {len(ours)} tensors, {total} parameters, C++ and torch agree")
PY
done

"$python" "$root/models/torch_gpt.py" init --model gpt-tiny --seed 7 --out "$dir/init.safetensors"
"$python" - "$root/models" "$dir/init.safetensors" "$dir/cpp.json" <<'PY'
import math, sys
sys.path.insert(0, sys.argv[1])
import torch
import load_checkpoint, torch_gpt

path = sys.argv[2]
tensors, metadata = load_checkpoint.read_safetensors(path)
assert metadata["model"] == "gpt:layers=2,d=64,heads=4,ctx=64,vocab=256", metadata
config = torch_gpt.parse_model(metadata["model"])
model = torch_gpt.Gpt(config)
torch_gpt.load_weights(model, path)  # load_state_dict(strict=True) inside
for name, p in model.state_dict().items():
    assert torch.equal(p, tensors[name]), f"{name} differs after loading"

# GPT-2's initialisation: N(0, 0.02), residual projections N(0, 0.02 / sqrt(2 * layers)).
wte = tensors["transformer.wte.weight"]
assert abs(wte.std().item() - 0.02) < 0.001, wte.std()
proj = torch.cat([tensors[f"transformer.h.{i}.{m}.c_proj.weight"].flatten()
                  for i in range(2) for m in ("attn", "mlp")])
assert abs(proj.std().item() - 0.01) < 0.0005, proj.std()
assert torch.count_nonzero(tensors["transformer.h.1.mlp.c_fc.bias"]) == 0
assert torch.all(tensors["transformer.ln_f.weight"] == 1)

# Small logits at initialisation: the loss is close to a uniform guess, ln(256).
gen = torch.Generator().manual_seed(0)
idx = torch.randint(0, 256, (4, 64), generator=gen)
targets = torch.randint(0, 256, (4, 64), generator=gen)
logits, loss = model(idx, targets)
assert logits.shape == (4, 64, 256), logits.shape
assert abs(loss.item() - math.log(256)) < 0.05, loss.item()

# Causal: changing token 10 leaves the logits before position 10 alone, not after it.
changed = idx.clone()
changed[:, 10] = (changed[:, 10] + 1) % 256
with torch.no_grad():
    a, _ = model(idx)
    b, _ = model(changed)
assert torch.equal(a[:, :10], b[:, :10]), "a position saw a later token"
assert not torch.allclose(a[:, 10:], b[:, 10:]), "a change of token 10 had no effect"
loss.backward()
assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
print(f"torch_gpt: gpt-tiny initial weights load strictly; loss at init {loss.item():.4f} "
      f"(ln 256 = {math.log(256):.4f}); attention is causal")
PY
