#!/usr/bin/python3
"""The PyTorch 1.13 reference of ddp's GPT (models/gpt_config.h), for parity tests.

A nanoGPT-style GPT-2: token + learned position embeddings, pre-LayerNorm blocks
(LayerNorm, causal multi-head self-attention, residual, LayerNorm, MLP 4x with GELU's
tanh approximation, residual), final LayerNorm, LM head tied to the token embedding,
dropout (0 by default). Its state_dict holds exactly the tensors of ddp's gpt_tensors,
in the same order and shapes: GPT-2's names, Linear weights [out, in] as torch.nn.Linear
stores them (Note [gpt weight layout] in models/gpt_config.h), and no lm_head.weight (the
head multiplies by transformer.wte.weight). The causal mask is an explicit buffer, not
part of the state_dict: torch 1.13 has no scaled_dot_product_attention.

GPT-2's initialisation: every Linear and Embedding weight ~ N(0, 0.02), biases 0,
LayerNorm weight 1 and bias 0, and the two residual projections of each block
(attn.c_proj.weight, mlp.c_proj.weight) ~ N(0, 0.02 / sqrt(2 * layers)).

    torch_gpt.py init --model gpt-tiny --seed 1234 --out init.safetensors
        writes initial weights (F32, safetensors, metadata "model" = the gpt: spec) and
        prints "gpt-tiny (gpt:layers=2,...): 120576 parameters in 28 tensors -> init.safetensors"
    torch_gpt.py tensors --model gpt2
        prints the model's parameter count and tensor names and shapes as JSON, the format
        of ddp's gpt_tensors program (tests/e2e/torch_gpt_test.sh compares the two)

Exit codes: 0 ok, 2 usage error (a bad --model included), 3 a file could not be read.
"""

import argparse
import dataclasses
import json
import math
import os
import struct
import sys

import torch
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import load_checkpoint  # noqa: E402  (the plain-Python safetensors reader)

SPEC_PREFIX = "gpt:"
SPEC_EXAMPLE = "gpt:layers=4,d=128,heads=4,ctx=128"
VALID_KEYS = ("layers", "d", "heads", "ctx", "vocab", "dropout")
INIT_STD = 0.02


@dataclasses.dataclass
class GptConfig:
    name: str
    layers: int
    d_model: int
    heads: int
    context: int
    vocab: int = 256
    dropout: float = 0.0


# The same named configs as models/gpt_config.cpp.
NAMED = {
    "gpt-tiny": GptConfig("gpt-tiny", 2, 64, 4, 64, 256),
    "gpt-mini": GptConfig("gpt-mini", 6, 384, 6, 256, 256),
    "gpt2": GptConfig("gpt2", 12, 768, 12, 1024, 50257),
}


def parse_model(model):
    """A named config or a gpt: spec, with the C++ parser's rules; ValueError otherwise."""
    if model in NAMED:
        return dataclasses.replace(NAMED[model])
    if not model.startswith(SPEC_PREFIX):
        raise ValueError(f"--model '{model}': valid gpt models are {', '.join(NAMED)}, "
                         f"or a spec like {SPEC_EXAMPLE} (optional vocab=, dropout=)")
    values = {}
    for part in model[len(SPEC_PREFIX):].split(","):
        key, eq, value = part.partition("=")
        if not eq or not key:
            raise ValueError(f"--model '{model}': '{part}' is not key=value; "
                             f"write it like {SPEC_EXAMPLE}")
        if key not in VALID_KEYS:
            raise ValueError(f"--model '{model}': unknown key '{key}'; "
                             f"valid keys are {', '.join(VALID_KEYS)}")
        if key in values:
            raise ValueError(f"--model '{model}': {key} is given twice; give each key once")
        values[key] = value
    for key in ("layers", "d", "heads", "ctx"):
        if key not in values:
            raise ValueError(f"--model '{model}': {key}= is missing; a gpt spec needs layers, "
                             f"d, heads and ctx (vocab defaults to 256 bytes), like {SPEC_EXAMPLE}")

    def whole(key):
        text = values[key]
        if not text.isdigit() or int(text) <= 0:
            raise ValueError(f"--model '{model}': {key}={text} is not a positive whole number; "
                             f"write it like {SPEC_EXAMPLE}")
        return int(text)

    config = GptConfig(model, whole("layers"), whole("d"), whole("heads"), whole("ctx"),
                       whole("vocab") if "vocab" in values else 256,
                       float(values.get("dropout", "0")))
    if config.d_model % config.heads:
        raise ValueError(f"gpt model '{model}': d={config.d_model} is not divisible by "
                         f"heads={config.heads}")
    if not 0.0 <= config.dropout < 1.0:
        raise ValueError(f"gpt model '{model}': dropout={config.dropout} is not a probability "
                         "in [0, 1)")
    return config


def describe(config):
    """The gpt: spec ddp's describe writes (models/gpt_config.cpp)."""
    text = (f"gpt:layers={config.layers},d={config.d_model},heads={config.heads},"
            f"ctx={config.context},vocab={config.vocab}")
    if config.dropout:
        text += f",dropout={config.dropout:g}"
    return text


class CausalSelfAttention(nn.Module):
    def __init__(self, config, device=None):
        super().__init__()
        d = config.d_model
        self.heads = config.heads
        self.c_attn = nn.Linear(d, 3 * d, device=device)
        self.c_proj = nn.Linear(d, d, device=device)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        # True where a query may attend: keys at its own position or before it.
        mask = torch.tril(torch.ones(config.context, config.context, dtype=torch.bool,
                                     device=device))
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x):
        batch, time, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)
        # [B, T, d] -> [B, heads, T, head_dim]
        q, k, v = (t.view(batch, time, self.heads, d // self.heads).transpose(1, 2)
                   for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // self.heads))
        scores = scores.masked_fill(~self.mask[:time, :time], float("-inf"))
        weights = self.attn_dropout(F.softmax(scores, dim=-1))
        y = (weights @ v).transpose(1, 2).contiguous().view(batch, time, d)
        return self.resid_dropout(self.c_proj(y))


class Mlp(nn.Module):
    def __init__(self, config, device=None):
        super().__init__()
        d = config.d_model
        self.c_fc = nn.Linear(d, 4 * d, device=device)
        self.c_proj = nn.Linear(4 * d, d, device=device)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))


class Block(nn.Module):
    def __init__(self, config, device=None):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.d_model, device=device)
        self.attn = CausalSelfAttention(config, device)
        self.ln_2 = nn.LayerNorm(config.d_model, device=device)
        self.mlp = Mlp(config, device)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Gpt(nn.Module):
    def __init__(self, config, device=None):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab, config.d_model, device=device),
            wpe=nn.Embedding(config.context, config.d_model, device=device),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config, device) for _ in range(config.layers)]),
            ln_f=nn.LayerNorm(config.d_model, device=device),
        ))

    def forward(self, idx, targets=None):
        """(logits [B, T, vocab], mean cross-entropy over B*T or None without targets)."""
        batch, time = idx.shape
        if time > self.config.context:
            raise ValueError(f"a sequence of {time} tokens is longer than the context "
                             f"{self.config.context}")
        t = self.transformer
        pos = torch.arange(time, device=idx.device)
        x = t.drop(t.wte(idx) + t.wpe(pos))
        for block in t.h:
            x = block(x)
        logits = F.linear(t.ln_f(x), t.wte.weight)  # the tied LM head
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss

    def init_weights(self, seed):
        """GPT-2's initialisation from a torch.Generator seeded with seed."""
        gen = torch.Generator().manual_seed(seed)
        residual_std = INIT_STD / math.sqrt(2 * self.config.layers)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("c_proj.weight"):
                    p.copy_(torch.normal(0.0, residual_std, p.shape, generator=gen))
                elif name.endswith(("wte.weight", "wpe.weight", "c_attn.weight", "c_fc.weight")):
                    p.copy_(torch.normal(0.0, INIT_STD, p.shape, generator=gen))
                elif "ln_" in name and name.endswith(".weight"):
                    p.fill_(1.0)
                elif name.endswith(".bias"):
                    p.zero_()
                else:
                    raise AssertionError(f"no initialisation rule for {name}")
        return self


def tensor_list(model):
    """[(name, shape)] of the state_dict, in order."""
    return [(name, list(t.shape)) for name, t in model.state_dict().items()]


def tensors_json(model):
    """The JSON object ddp's gpt_tensors prints for the same config."""
    tensors = tensor_list(model)
    return {
        "model": describe(model.config),
        "parameters": sum(p.numel() for p in model.parameters()),
        "tensors": [{"name": n, "shape": s} for n, s in tensors],
    }


def write_safetensors(path, tensors, metadata):
    """Writes F32 tensors (name -> tensor, in order) as safetensors: an 8-byte little-endian
    header length, the JSON header padded with spaces to 8 bytes, then the raw data."""
    header, chunks, offset = {}, [], 0
    for name, t in tensors.items():
        data = t.detach().to(torch.float32).contiguous().cpu().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for chunk in chunks:
            f.write(chunk)


def load_weights(model, path):
    """Loads the model tensors of a safetensors file with load_state_dict(strict=True);
    returns the file's metadata. Tensors named "optimizer.*" are ignored."""
    tensors, metadata = load_checkpoint.read_safetensors(path)
    state = {n: t for n, t in tensors.items() if not n.startswith("optimizer.")}
    model.load_state_dict(state, strict=True)
    return metadata


def main(argv):
    parser = argparse.ArgumentParser(description="ddp's GPT in PyTorch: initial weights and "
                                     "the tensor list")
    sub = parser.add_subparsers(dest="command", required=True)
    init = sub.add_parser("init", help="write GPT-2-initialised weights to safetensors")
    init.add_argument("--model", required=True)
    init.add_argument("--seed", type=int, default=1234)
    init.add_argument("--out", required=True)
    tensors = sub.add_parser("tensors", help="print the parameter count and tensors as JSON")
    tensors.add_argument("--model", required=True)
    args = parser.parse_args(argv)
    try:
        config = parse_model(args.model)
    except ValueError as e:
        print(f"torch_gpt.py: {e}", file=sys.stderr)
        return 2
    if args.command == "tensors":
        # The meta device: shapes without memory or initialisation (gpt2 is 124M).
        print(json.dumps(tensors_json(Gpt(config, device="meta"))))
        return 0
    model = Gpt(config).init_weights(args.seed)
    write_safetensors(args.out, model.state_dict(),
                      {"format": "ddp-gpt-init-v1", "model": describe(config),
                       "seed": args.seed})
    count = sum(p.numel() for p in model.parameters())
    print(f"{args.model} ({describe(config)}): {count} parameters in "
          f"{len(model.state_dict())} tensors -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
