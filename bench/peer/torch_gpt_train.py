#!/usr/bin/python3
"""The PyTorch peer of `train --model gpt-*`: the same GPT, batch and optimizer, timed.

Trains models/torch_gpt.py's Gpt (the reference of ddp's models/gpt.h, eager PyTorch
1.13: explicit causal mask and softmax, as nanoGPT without flash attention) on random
contiguous windows of a byte stream, with AdamW over nanoGPT's two parameter groups
(weight decay on the 2-D weights only), global gradient-norm clipping and a constant
learning rate. After --warmup untimed steps it times --steps steps and prints one
JSON line:

  {"impl": "torch", "model": "gpt-mini", "batch": 8, "context": 256, "threads": 1,
   "tokens_per_s": ..., "step_ms": ..., ...}

The byte stream is --stream-bytes random bytes from the seed (the Brown corpus's
training split is 5.4 MB): what a step computes does not depend on the token values,
and the stream is in memory before timing starts (pre-loaded data). Each step gathers
--batch windows of context + 1 bytes at random offsets (inputs and the targets shifted
by one), as ddp's TextWindowSampler does per rank.

What the timing includes: window gathering, forward, loss, backward, clipping, the
optimizer step and one loss.item() per step. It excludes building the model, the
stream and the warmup steps.

On a GPU (--device cuda): the model, the stream and the windows live on the device,
matmuls run in fp32 (TF32 off, PyTorch's default and what ddp's cuBLAS sgemm does),
and loss.item() ends every step, so the timer measures finished work.

Distributed: if WORLD_SIZE > 1 in the environment (set RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT yourself, or launch it with ddprun), torch.distributed is initialized with
gloo, the model is wrapped in DistributedDataParallel(bucket_cap_mb=...), each rank
draws its own windows, and only rank 0 prints; --batch is per rank and tokens_per_s
counts all ranks' tokens.
"""

import argparse
import json
import os
import sys
import time


def _early_threads(argv):
    """--threads, read before torch (and its OpenBLAS) is loaded."""
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--threads", default="1")
    return early.parse_known_args(argv)[0].threads


# torch.set_num_threads does not reach the OpenBLAS that Debian's torch calls for
# Linear layers; OpenBLAS reads its thread count from the environment when it loads.
os.environ.setdefault("OPENBLAS_NUM_THREADS", _early_threads(sys.argv[1:]))
os.environ.setdefault("OMP_NUM_THREADS", _early_threads(sys.argv[1:]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models"))
import torch_gpt  # noqa: E402


def positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"'{text}': must be >= 1")
    return value


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description="Time PyTorch training steps of ddp's GPT (the peer of `train --model gpt-*`).",
        epilog="Prints one JSON line on stdout. See the module docstring for what is timed.")
    parser.add_argument("--model", default="gpt-mini",
                        help="gpt-tiny, gpt-mini, gpt2 or a gpt: spec (default %(default)s)")
    parser.add_argument("--batch", "--batch-size", dest="batch", type=positive_int, default=8,
                        help="sequences per step (per rank) (default %(default)s)")
    parser.add_argument("--steps", type=positive_int, default=20,
                        help="timed training steps (default %(default)s)")
    parser.add_argument("--warmup", type=int, default=3,
                        help="untimed steps before timing (default %(default)s)")
    parser.add_argument("--threads", type=positive_int, default=1,
                        help="torch.set_num_threads (default %(default)s)")
    parser.add_argument("--lr", type=float, default=1e-3, help="constant lr (default %(default)s)")
    parser.add_argument("--weight-decay", type=float, default=0.1,
                        help="weight decay of the 2-D weights (default %(default)s)")
    parser.add_argument("--clip-grad-norm", type=float, default=1.0,
                        help="global gradient-norm clipping, 0 = off (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="init and data seed (default 0)")
    parser.add_argument("--stream-bytes", type=positive_int, default=5_366_311,
                        help="bytes of the random stream (default: the Brown train split's)")
    parser.add_argument("--device", default="cpu",
                        help="cpu or cuda[:N]; on CUDA the timer waits for the device "
                             "(fp32 matmuls, TF32 off as PyTorch's default) (default %(default)s)")
    parser.add_argument("--bucket-cap-mb", type=float, default=25.0,
                        help="DistributedDataParallel bucket_cap_mb (default %(default)s)")
    args = parser.parse_args(argv)
    if args.warmup < 0:
        parser.error("--warmup must be >= 0")
    try:
        args.config = torch_gpt.parse_model(args.model)
    except ValueError as e:
        parser.error(str(e))
    if args.device != "cpu" and not args.device.startswith("cuda"):
        parser.error(f"--device {args.device}: valid values are cpu, cuda, cuda:N")
    if args.stream_bytes <= args.config.context + 1:
        parser.error(f"--stream-bytes {args.stream_bytes}: must exceed context + 1 = "
                     f"{args.config.context + 1}")
    return args


def init_distributed():
    """(rank, world_size); initializes gloo when WORLD_SIZE > 1."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return 0, 1
    import torch.distributed as dist
    for var in ("RANK", "MASTER_ADDR", "MASTER_PORT"):
        if var not in os.environ:
            sys.exit(f"torch_gpt_train: WORLD_SIZE={world_size} needs {var} in the environment")
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    return rank, world_size


def decay_groups(model, weight_decay):
    """nanoGPT's groups: 2-D parameters decay, biases and LayerNorm parameters do not."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    rank, world_size = init_distributed()
    config = args.config
    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            sys.exit(f"torch_gpt_train: --device {args.device}: this PyTorch sees no CUDA device")
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 as ddp's cuBLAS sgemm
        if device.index is not None:
            torch.cuda.set_device(device)
    model = torch_gpt.Gpt(config).init_weights(args.seed).to(device)
    if world_size > 1:
        # The causal masks are bool buffers, equal on every rank; gloo cannot broadcast
        # bool ("Invalid scalar type"), so DDP is told to leave the buffers alone.
        torch.nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
            model, [name for name, _ in model.named_buffers()])
        model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=args.bucket_cap_mb)
    model.train()
    optimizer = torch.optim.AdamW(decay_groups(model, args.weight_decay), lr=args.lr,
                                  betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(args.seed * 1000 + rank)
    stream = torch.randint(0, config.vocab, (args.stream_bytes,), generator=gen).to(device)
    ctx = config.context
    offsets = torch.arange(ctx + 1, device=device)

    def step():
        starts = torch.randint(0, args.stream_bytes - ctx - 1, (args.batch, 1),
                               generator=gen).to(device)
        windows = stream[starts + offsets]  # [batch, ctx + 1]
        x, y = windows[:, :-1], windows[:, 1:]
        optimizer.zero_grad(set_to_none=False)
        logits, _ = model(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))
        loss.backward()
        if args.clip_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad_norm)
        optimizer.step()
        return loss.item()

    for _ in range(args.warmup):
        step()
    if world_size > 1:
        torch.distributed.barrier()
    loss = 0.0
    start = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    elapsed = time.perf_counter() - start

    if rank == 0:
        tokens = args.steps * args.batch * ctx * world_size
        print(json.dumps({
            "impl": "torch",
            "model": args.model,
            "spec": torch_gpt.describe(config),
            "batch": args.batch,
            "context": ctx,
            "threads": args.threads,
            "device": str(device),
            "tokens_per_s": round(tokens / elapsed, 1),
            "step_ms": round(1e3 * elapsed / args.steps, 3),
            "steps": args.steps,
            "warmup": args.warmup,
            "world_size": world_size,
            "bucket_cap_mb": args.bucket_cap_mb,
            "last_loss": round(loss, 4),
            "torch": torch.__version__,
        }), flush=True)
    if world_size > 1:
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
