#!/usr/bin/python3
"""The PyTorch 1.13 reference of ddp's GPT (models/gpt_config.h), for parity tests.

A nanoGPT-style GPT-2: token + learned position embeddings, pre-LayerNorm blocks
(LayerNorm, causal multi-head self-attention, residual, LayerNorm, MLP 4x with GELU's
tanh approximation, residual), final LayerNorm, LM head tied to the token embedding,
dropout (0 by default). Its state_dict holds exactly the tensors of ddp's gpt_tensors,
in the same order and shapes: GPT-2's names, Linear weights [out, in] as torch.nn.Linear
stores them (Note [gpt weight layout] in models/gpt_config.h), and no lm_head.weight (the
head multiplies by transformer.wte.weight). The causal mask is an explicit buffer, not
part of the state_dict: torch 1.13 has no scaled_dot_product_attention. Gpt(config,
sdpa=True) (PyTorch >= 2.0; bench/peer/torch_gpt_train.py --sdpa) computes attention with
F.scaled_dot_product_attention(is_causal=True) instead; the mask buffer stays, unused, so
the module tree and the state_dict are the same. The default, sdpa=False, is the explicit
mask and softmax the parity tests compare with.

GPT-2's initialisation: every Linear and Embedding weight ~ N(0, 0.02), biases 0,
LayerNorm weight 1 and bias 0, and the two residual projections of each block
(attn.c_proj.weight, mlp.c_proj.weight) ~ N(0, 0.02 / sqrt(2 * layers)).

    torch_gpt.py init --model gpt-tiny --seed 1234 --out init.safetensors
        writes initial weights (F32, safetensors, metadata "model" = the gpt: spec) and
        prints "gpt-tiny (gpt:layers=2,...): 120576 parameters in 28 tensors -> init.safetensors"
    torch_gpt.py tensors --model gpt2
        prints the model's parameter count and tensor names and shapes as JSON, the format
        of ddp's gpt_tensors program (tests/e2e/torch_gpt_test.sh compares the two)
    torch_gpt.py parity --dir DIR [--load-init F.safetensors]
        the golden parity check of ddp's C++ GPT (tests/e2e/gpt_parity_test.sh): loads the
        files models/gpt_parity.cpp wrote into DIR, runs the same batch and the same AdamW
        steps in torch, asserts that logits, loss and every gradient agree to 1e-4, the
        losses and gradient norms to 1e-3 and the weights after the steps to 1e-4 (relative,
        see parity_error and comparable), and prints the worst figures. With
        --load-init, F is a file of `init` that gpt_parity --load read into the C++ model:
        its logits (DIR/load_logits.safetensors) must equal torch's on F to 1e-4.
    torch_gpt.py curve --dir DIR [--threads N]
        the loss-curve benchmark (bench/gpt_loss_curve.sh): replays the steps of
        gpt_parity --curve (its init, batches and learning rates) into DIR/torch_curve.tsv.

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
VALID_KEYS = ("layers", "d", "heads", "ctx", "vocab", "padded_vocab", "dropout")
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
    # ddp pads its LM head's product to this many columns (Note [padded head]): the same
    # function, so this model computes the unpadded head; kept for the spec's round trip.
    padded_vocab: int = 0


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
                         f"or a spec like {SPEC_EXAMPLE} (optional vocab=, padded_vocab=, "
                         "dropout=)")
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
                       float(values.get("dropout", "0")),
                       whole("padded_vocab") if "padded_vocab" in values else 0)
    if config.padded_vocab and config.padded_vocab < config.vocab:
        raise ValueError(f"gpt model '{model}': padded_vocab={config.padded_vocab} is smaller "
                         f"than vocab={config.vocab}")
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
    if config.padded_vocab:
        text += f",padded_vocab={config.padded_vocab}"
    if config.dropout:
        text += f",dropout={config.dropout:g}"
    return text


def has_sdpa():
    """Whether this torch has F.scaled_dot_product_attention (PyTorch >= 2.0)."""
    return hasattr(F, "scaled_dot_product_attention")


class CausalSelfAttention(nn.Module):
    def __init__(self, config, device=None, sdpa=False):
        super().__init__()
        if sdpa and not has_sdpa():
            raise RuntimeError(f"sdpa=True needs F.scaled_dot_product_attention (PyTorch >= 2.0); "
                               f"this is torch {torch.__version__}: use sdpa=False (the "
                               "explicit causal mask) or a PyTorch 2 install")
        d = config.d_model
        self.heads = config.heads
        self.sdpa = sdpa
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
        if self.sdpa:
            # The same maths as below (scale 1/sqrt(head_dim), causal, dropout on the
            # weights) in one fused kernel (flash or memory-efficient attention on CUDA).
            y = F.scaled_dot_product_attention(
                q, k, v, dropout_p=self.attn_dropout.p if self.training else 0.0,
                is_causal=True)
            y = y.transpose(1, 2).contiguous().view(batch, time, d)
            return self.resid_dropout(self.c_proj(y))
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
    def __init__(self, config, device=None, sdpa=False):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.d_model, device=device)
        self.attn = CausalSelfAttention(config, device, sdpa)
        self.ln_2 = nn.LayerNorm(config.d_model, device=device)
        self.mlp = Mlp(config, device)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Gpt(nn.Module):
    def __init__(self, config, device=None, sdpa=False):
        """sdpa: attention through F.scaled_dot_product_attention (PyTorch >= 2.0;
        RuntimeError on an older torch) instead of the explicit mask and softmax."""
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab, config.d_model, device=device),
            wpe=nn.Embedding(config.context, config.d_model, device=device),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config, device, sdpa) for _ in range(config.layers)]),
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


# Note [parity steps] in models/gpt_parity.cpp: the optimisation both sides run.
PARITY_STEPS, PARITY_WARMUP, PARITY_LR, PARITY_MIN_LR = 10, 3, 1e-3, 1e-4
PARITY_WEIGHT_DECAY, PARITY_BETAS, PARITY_EPS, PARITY_MAX_NORM = 0.1, (0.9, 0.95), 1e-8, 1.0
PARITY_TOL, PARITY_LOSS_TOL = 1e-4, 1e-3


def real_logits(cpp_logits, vocab, failures):
    """ddp's logits without a padded head's columns (Note [padded head]: -inf past vocab;
    this model computes the unpadded head, the same function)."""
    if cpp_logits.size(-1) == vocab:
        return cpp_logits
    rest = cpp_logits[..., vocab:]
    if not bool(torch.isneginf(rest).all()):
        failures.append(f"the padded head's logits past {vocab} columns are not all -inf")
    return cpp_logits[..., :vocab]


def parity_error(ours, theirs):
    """Relative error of a tensor: max |ours - theirs| / max |theirs| over its elements
    (one scale per tensor, so elements near 0 do not blow the ratio up)."""
    ours, theirs = ours.double(), theirs.double()
    scale = theirs.abs().max().item()
    return (ours - theirs).abs().max().item() / (scale if scale > 0 else 1.0)


def parity_lr(step):
    """models/gpt_parity.cpp's schedule (optim::LrSchedule cosine): linear warmup, then a
    cosine from PARITY_LR down to PARITY_MIN_LR at PARITY_STEPS."""
    if step < PARITY_WARMUP:
        return PARITY_LR * (step + 1) / PARITY_WARMUP
    progress = min(1.0, (step - PARITY_WARMUP) / max(PARITY_STEPS - PARITY_WARMUP, 1))
    return PARITY_MIN_LR + (PARITY_LR - PARITY_MIN_LR) * 0.5 * (1 + math.cos(math.pi * progress))


def parity_model(path):
    """The torch model of a safetensors file's "model" metadata, loaded strictly from it."""
    metadata = load_checkpoint.read_safetensors(path)[1]
    model = Gpt(parse_model(metadata["model"]))
    load_weights(model, path)
    return model


def check_step0(model, batch, cpp, failures):
    """Logits, loss and every gradient of one forward/backward; returns the worst error."""
    logits, loss = model(batch["inputs"], batch["targets"])
    loss.backward()
    errors = {"logits": parity_error(real_logits(cpp["logits"], logits.size(-1), failures),
                                     logits.detach()),
              "loss": parity_error(cpp["loss"], loss.detach().reshape(1))}
    for name, p in model.named_parameters():
        errors["grad." + name] = parity_error(cpp["grad." + name], p.grad)
    worst = max(errors, key=errors.get)
    failures += [f"{n}: relative error {e:.3g} > {PARITY_TOL}" for n, e in errors.items()
                 if not e <= PARITY_TOL]
    grad_worst = max((e, n) for n, e in errors.items() if n.startswith("grad."))
    print(f"parity: logits {errors['logits']:.3g}, loss {errors['loss']:.3g} "
          f"({loss.item():.6f}), worst gradient {grad_worst[0]:.3g} ({grad_worst[1]}) "
          f"of {len(errors) - 2}; worst overall {worst}")


def check_steps(model, batch, steps_file, failures):
    """The same AdamW steps in torch (Note [parity steps]); compares the losses."""
    rows = [line.split("\t") for line in open(steps_file).read().splitlines()[1:]]
    if len(rows) != PARITY_STEPS:
        failures.append(f"{steps_file}: {len(rows)} steps, expected {PARITY_STEPS}")
        return
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": PARITY_WEIGHT_DECAY},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=PARITY_LR, betas=PARITY_BETAS, eps=PARITY_EPS)
    worst = (0.0, 0)
    for step, (_, lr_cpp, loss_cpp, norm_cpp) in enumerate(rows):
        lr = parity_lr(step)
        if abs(float(lr_cpp) - lr) > 1e-6 * lr:
            failures.append(f"step {step}: C++ learning rate {lr_cpp}, expected {lr}")
        for group in opt.param_groups:
            group["lr"] = lr
        opt.zero_grad(set_to_none=True)
        _, loss = model(batch["inputs"], batch["targets"])
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), PARITY_MAX_NORM).item()
        opt.step()
        err = abs(float(loss_cpp) - loss.item()) / abs(loss.item())
        worst = max(worst, (err, step))
        if not err <= PARITY_LOSS_TOL:
            failures.append(f"step {step}: loss {loss_cpp} in C++, {loss.item():.9g} in torch "
                            f"(relative error {err:.3g} > {PARITY_LOSS_TOL})")
        if not abs(float(norm_cpp) - norm) <= PARITY_LOSS_TOL * norm:
            failures.append(f"step {step}: gradient norm {norm_cpp} in C++, {norm:.9g} in torch")
        print(f"parity: step {step} lr {lr:.3g} loss C++ {float(loss_cpp):.6f} torch "
              f"{loss.item():.6f} grad norm C++ {float(norm_cpp):.4f} torch {norm:.4f}")
    print(f"parity: {PARITY_STEPS} AdamW steps, worst loss relative error {worst[0]:.3g} "
          f"(step {worst[1]})")


def comparable(name, t):
    """t without the parts whose trajectory is rounding noise: the key third of c_attn.bias
    adds the same amount to every score of a row, which softmax ignores, so its gradient is
    exactly 0 in exact arithmetic and Adam turns the ~1e-9 rounding left in it into
    steps of about lr in either direction."""
    if name.endswith("attn.c_attn.bias"):
        d = t.numel() // 3
        return torch.cat([t[:d], t[2 * d:]])
    return t


def check_final(model, final_file, failures):
    """The weights after the steps, per tensor (relative, parity_error)."""
    final, _ = load_checkpoint.read_safetensors(final_file)
    errors = {n: parity_error(comparable(n, final[n]), comparable(n, p.detach()))
              for n, p in model.named_parameters()}
    worst = max(errors, key=errors.get)
    print(f"parity: weights after the steps: worst relative error {errors[worst]:.3g} ({worst})")
    failures += [f"final {n}: relative error {e:.3g} > {PARITY_TOL}" for n, e in errors.items()
                 if not e <= PARITY_TOL]


def parity(directory, load_init):
    """Returns 0 when every figure is within tolerance, 1 otherwise (listing them)."""
    torch.manual_seed(0)
    batch, meta = load_checkpoint.read_safetensors(os.path.join(directory, "batch.safetensors"))
    print(f"parity: batch {list(batch['inputs'].shape)} from the {meta.get('corpus')} corpus")
    cpp, _ = load_checkpoint.read_safetensors(os.path.join(directory, "step0.safetensors"))
    failures = []
    model = parity_model(os.path.join(directory, "init.safetensors"))
    check_step0(model, batch, cpp, failures)
    model = parity_model(os.path.join(directory, "init.safetensors"))
    check_steps(model, batch, os.path.join(directory, "steps.tsv"), failures)
    check_final(model, os.path.join(directory, "final.safetensors"), failures)
    if load_init:
        theirs, _ = load_checkpoint.read_safetensors(
            os.path.join(directory, "load_logits.safetensors"))
        with torch.no_grad():
            logits, _ = parity_model(load_init)(batch["inputs"])
        err = parity_error(real_logits(theirs["logits"], logits.size(-1), failures), logits)
        print(f"parity: torch's init file in the C++ model: logits relative error {err:.3g}")
        if not err <= PARITY_TOL:
            failures.append(f"logits of {load_init} in C++: relative error {err:.3g}")
    for failure in failures:
        print(f"parity FAILED: {failure}", file=sys.stderr)
    return 1 if failures else 0


def curve(directory, threads):
    """The loss-curve benchmark's torch side: replays gpt_parity --curve's run (same init,
    batches and learning rates) and writes DIR/torch_curve.tsv in curve.tsv's format."""
    torch.set_num_threads(threads)
    model = parity_model(os.path.join(directory, "init.safetensors"))
    batches = load_checkpoint.read_safetensors(
        os.path.join(directory, "curve_batches.safetensors"))[0]
    inputs, targets = torch.as_tensor(batches["inputs"]), torch.as_tensor(batches["targets"])
    rows = [line.split("\t") for line in
            open(os.path.join(directory, "curve.tsv")).read().splitlines()[1:]]
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": PARITY_WEIGHT_DECAY},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=PARITY_LR, betas=PARITY_BETAS, eps=PARITY_EPS)
    with open(os.path.join(directory, "torch_curve.tsv"), "w") as out:
        out.write("step\tlr\tloss\tgrad_norm\n")
        for step, row in enumerate(rows):
            lr = float(row[1])
            for group in opt.param_groups:
                group["lr"] = lr
            opt.zero_grad(set_to_none=True)
            _, loss = model(inputs[step], targets[step])
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), PARITY_MAX_NORM).item()
            opt.step()
            out.write(f"{step}\t{lr:.9g}\t{loss.item():.9g}\t{norm:.9g}\n")
            if (step + 1) % 20 == 0:
                print(f"torch_gpt.py curve: step {step + 1}/{len(rows)}", file=sys.stderr)
    return 0


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
    check = sub.add_parser("parity", help="compare ddp's C++ GPT (gpt_parity's files) "
                           "with this model")
    check.add_argument("--dir", required=True)
    check.add_argument("--load-init", default="")
    replay = sub.add_parser("curve", help="replay gpt_parity --curve's run in torch "
                            "(writes DIR/torch_curve.tsv)")
    replay.add_argument("--dir", required=True)
    replay.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    if args.command == "parity":
        return parity(args.dir, args.load_init)
    if args.command == "curve":
        return curve(args.dir, args.threads)
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
