#!/usr/bin/env bash
# Golden parity of ddp's C++ GPT (models/gpt.h) with PyTorch (models/torch_gpt.py):
# gpt_parity writes gpt-tiny's initial weights, a batch of the Brown corpus's train split
# (a generated stream when the corpus is missing; the output says which), the logits, loss
# and every parameter gradient, and the losses of 10 AdamW steps; `torch_gpt.py parity`
# loads the same weights and batch into torch and asserts logits, loss and gradients to
# 1e-4, the 10 losses and gradient norms to 1e-3 and the weights after the steps to 1e-4
# (relative: max|C++ - torch| / max|torch| per tensor; torch_gpt.py parity_error).
# Then a file written by torch_gpt.py init is loaded into the C++ model (strict) and one
# forward must agree with torch's on it.
# Exit code 77 (skip) with the reason when /usr/bin/python3 (or $PYTHON) cannot import torch.
# usage: gpt_parity_test.sh GPT_PARITY_BINARY
set -euo pipefail
gpt_parity=$1
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
. "$(dirname "${BASH_SOURCE[0]}")/lib_torch.sh"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

"$gpt_parity" --model gpt-tiny --seed 7 --out "$dir"
"$python" "$root/models/torch_gpt.py" init --model gpt-tiny --seed 11 --out "$dir/torch_init.safetensors"
"$gpt_parity" --model gpt-tiny --seed 7 --out "$dir" --load "$dir/torch_init.safetensors"
"$python" "$root/models/torch_gpt.py" parity --dir "$dir" --load-init "$dir/torch_init.safetensors"
