"""PyTorch 1.13's DDP + Join on the uneven shares of `train --drop-last false`, for
tests/e2e/join_torch.sh.

  prepare DIR      a tiny Fashion-MNIST-format data set (the four IDX .gz files:
                   --train N random images, 16 test images) and DIR/init.st, the
                   initial weights of the mlp 784-H-10 from torch.manual_seed, as a
                   train checkpoint at step 0 (no optimizer state) for --resume
  torch DIR OUT    --world W ranks (gloo, torch.multiprocessing) train that mlp
                   from DIR/init.st for --epochs, each epoch inside ddp.join(
                   divide_by_initial_world_size=--divide world): rank r takes the
                   samples train's sampler gives it (Note [sampler shuffle] in
                   runtime/data/sampler.h: the Philox permutation of seed + epoch,
                   positions r, r + W, ..., no padding), batches of --batch in that
                   order, the last one short, --accum micro-batches per step (the
                   first ones under no_sync(), each loss / accum, leftovers dropped),
                   SGD (--lr, --momentum); writes rank 0's final weights to OUT after
                   checking that every rank holds them
  simulate DIR OUT the same steps in one process without DDP: each step's gradient is
                   the sum over the ranks that still have a step of their gradients,
                   divided by --world or by their count, applied to one model and one
                   optimizer (so the state a joined rank keeps in `train` is modelled;
                   PyTorch's joined ranks leave their optimizer state behind)
  compare A B      the model tensors of two safetensors files: prints each tensor's
                   max |a - b| / max |b|; exit 1 if any exceeds --rtol (or, with
                   --expect-differ, if none does)
"""
import argparse
import gzip
import os
import socket
import struct
import sys
from contextlib import nullcontext

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "models"))
import load_checkpoint  # noqa: E402
import torch_gpt  # noqa: E402  (write_safetensors)
import torch_models  # noqa: E402

MASK = 0xFFFFFFFF


def philox_block(key, counter):
    """Philox 4x32-10 of runtime/rng/philox.h: the four words of `counter` under `key`."""
    c = [counter & MASK, (counter >> 32) & MASK, 0, 0]
    k0, k1 = key & MASK, (key >> 32) & MASK
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [((p1 >> 32) ^ c[1] ^ k0) & MASK, p1 & MASK, ((p0 >> 32) ^ c[3] ^ k1) & MASK,
             p0 & MASK]
        k0, k1 = (k0 + 0x9E3779B9) & MASK, (k1 + 0xBB67AE85) & MASK
    return c


def permutation(n, key):
    """runtime/data/sampler.cpp's philox_permutation: Fisher-Yates driven by Philox."""
    perm = list(range(n))
    block = None
    for k in range(n - 1):
        if k % 2 == 0:
            block = philox_block(key, k // 2)
        w = (k % 2) * 2
        r = (block[w] << 32) | block[w + 1]
        j = n - 1 - k
        pick = r % (j + 1)
        perm[j], perm[pick] = perm[pick], perm[j]
    return perm


def write_idx(path, array, magic):
    with gzip.open(path, "wb") as f:
        f.write(struct.pack(">I", magic))
        for d in array.shape:
            f.write(struct.pack(">I", d))
        f.write(array.astype(np.uint8).tobytes())


def prepare(args):
    rng = np.random.default_rng(7)
    for prefix, n in (("train", args.train), ("t10k", 16)):
        write_idx(os.path.join(args.dir, f"{prefix}-images-idx3-ubyte.gz"),
                  rng.integers(0, 256, size=(n, 28, 28)), torch_models.IDX_IMAGES_MAGIC)
        write_idx(os.path.join(args.dir, f"{prefix}-labels-idx1-ubyte.gz"),
                  rng.integers(0, 10, size=(n,)), torch_models.IDX_LABELS_MAGIC)
    torch.manual_seed(args.seed)
    model = torch_models.build("mlp", hidden=[args.hidden])
    metadata = {"format": "ddp-train-v1",
                "model": torch_models.describe("mlp", hidden=[args.hidden]),
                "optimizer": "sgd", "epoch": 0, "step": 0, "seed": 0, "lr": args.lr}
    torch_gpt.write_safetensors(os.path.join(args.dir, "init.st"), model.state_dict(), metadata)


def worker(rank, args, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=args.world)
    x, y = torch_models.load_fashion_mnist(args.dir, "train")
    model = torch_models.build("mlp", hidden=[args.hidden])
    tensors, _ = load_checkpoint.read_safetensors(os.path.join(args.dir, "init.st"))
    model.load_state_dict(tensors, strict=True)
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    for epoch in range(args.epochs):
        batches = rank_batches(args, len(y), epoch)[rank]
        with ddp.join(divide_by_initial_world_size=args.divide == "world"):
            for step in range(len(batches) // args.accum):
                opt.zero_grad(set_to_none=True)
                for m in range(args.accum):
                    idx = torch.tensor(batches[step * args.accum + m])
                    with ddp.no_sync() if m + 1 < args.accum else nullcontext():
                        loss = F.cross_entropy(ddp(x[idx]), y[idx]) / args.accum
                        loss.backward()
                opt.step()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(args.world)]
    dist.all_gather(gathered, flat)
    for r, g in enumerate(gathered):
        assert torch.equal(g, flat), f"torch: rank {r}'s weights differ from rank {rank}'s"
    if rank == 0:
        torch_gpt.write_safetensors(args.out, model.state_dict(), {"format": "torch-join"})
    dist.barrier()  # then exit: destroy_process_group hung once in 1.13 (gloo)


def rank_batches(args, n, epoch):
    order = permutation(n, args.seed + epoch)
    out = []
    for rank in range(args.world):
        mine = order[rank::args.world]
        batches = [mine[i:i + args.batch] for i in range(0, len(mine), args.batch)]
        out.append(batches[:len(batches) // args.accum * args.accum])
    return out


def simulate(args):
    x, y = torch_models.load_fashion_mnist(args.dir, "train")
    model = torch_models.build("mlp", hidden=[args.hidden])
    tensors, _ = load_checkpoint.read_safetensors(os.path.join(args.dir, "init.st"))
    model.load_state_dict(tensors, strict=True)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    for epoch in range(args.epochs):
        batches = rank_batches(args, len(y), epoch)
        for step in range(max(len(b) for b in batches) // args.accum):
            active = [b for b in batches if len(b) > step * args.accum]
            divisor = args.world if args.divide == "world" else len(active)
            opt.zero_grad(set_to_none=True)
            loss = 0
            for b in active:
                for m in range(args.accum):
                    idx = torch.tensor(b[step * args.accum + m])
                    loss = loss + F.cross_entropy(model(x[idx]), y[idx]) / args.accum / divisor
            loss.backward()
            opt.step()
    torch_gpt.write_safetensors(args.out, model.state_dict(), {"format": "simulated-join"})


def run_torch(args):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # fork, not spawn: a spawned worker imports torch again (about 1.3 s each, 9 of
    # them in join_torch.sh); this process has run no torch op, so no thread pool
    # is copied half-started.
    mp.start_processes(worker, args=(args, port), nprocs=args.world, join=True,
                       start_method="fork")


def compare(args):
    a, _ = load_checkpoint.read_safetensors(args.a)
    b, _ = load_checkpoint.read_safetensors(args.b)
    names = [n for n in b if not n.startswith("optimizer.")]
    worst = 0.0
    for n in names:
        rel = ((a[n] - b[n]).abs().max() / b[n].abs().max()).item()
        worst = max(worst, rel)
        print(f"  {n}: max |a - b| / max |b| = {rel:.3g}")
    if args.expect_differ:
        ok = worst > args.rtol
        print(f"{'differ' if ok else 'FAIL: agree'} (worst {worst:.3g}, rtol {args.rtol:g})")
    else:
        ok = worst <= args.rtol
        print(f"{'agree' if ok else 'FAIL: differ'} (worst {worst:.3g}, rtol {args.rtol:g})")
    sys.exit(0 if ok else 1)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("dir")
    p.add_argument("--train", type=int, required=True)
    p.add_argument("--hidden", type=int, default=8)
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--lr", type=float, default=0.05)
    for command in ("torch", "simulate"):
        t = sub.add_parser(command)
        t.add_argument("dir")
        t.add_argument("out")
        for flag, kind in (("--world", int), ("--batch", int), ("--accum", int),
                           ("--epochs", int), ("--lr", float), ("--momentum", float),
                           ("--hidden", int), ("--seed", int)):
            t.add_argument(flag, type=kind, required=flag not in ("--hidden", "--seed"))
        t.set_defaults(hidden=8, seed=0)
        t.add_argument("--divide", choices=("world", "active"), required=True)
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    c.add_argument("--rtol", type=float, required=True)
    c.add_argument("--expect-differ", action="store_true")
    args = parser.parse_args()
    commands = {"prepare": prepare, "torch": run_torch, "simulate": simulate, "compare": compare}
    commands[args.command](args)


if __name__ == "__main__":
    main()
