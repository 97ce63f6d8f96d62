#!/usr/bin/python3
"""The PyTorch peer of ddp's `train`: the same model, data, batch and optimizer, timed.

Trains models/torch_models.build(MODEL) on Fashion-MNIST's train split (or a
synthetic set of the same shape) with SGD (momentum 0.9, lr 0.02 constant),
shuffling each epoch like a loader does: the whole input tensor is indexed with
a random permutation and sliced into batches. After --warmup untimed steps it
times --steps steps and prints one JSON line:

  {"impl": "torch", "model": "mlp", "batch": 64, "threads": 1,
   "samples_per_s": ..., "step_ms": ..., ...}

What the timing includes: the per-epoch permutation gather (x[perm], y[perm])
when an epoch starts inside the timed window, batch slicing, forward, loss,
backward, optimizer step, and one loss.item() per step (as a progress log
would; --sync-every N reads it every N-th step instead, as ddp's `train` does
with N = 10). It excludes reading and normalizing the data set, model
construction and the warmup steps, and there is no evaluation.

--device cuda[:N]: the model on the GPU; each batch is sliced on the host,
pinned and copied with non_blocking=True (what a DataLoader with
pin_memory=True does, and what ddp's loader does); the clock starts and stops
after torch.cuda.synchronize().

Distributed: if WORLD_SIZE > 1 in the environment, torch.distributed is
initialized with the gloo backend from RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT (set them yourself; torchrun is not needed), the model is wrapped in
DistributedDataParallel, each rank takes every WORLD_SIZE-th sample of the
epoch's permutation (same seed on all ranks), and only rank 0 prints. --batch is
per rank; samples_per_s counts all ranks' samples.
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
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models"))
import torch_models  # noqa: E402


def positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"'{text}': must be >= 1")
    return value


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description="Time PyTorch training steps of ddp's zoo models (the peer of ddp's `train`).",
        epilog="Prints one JSON line on stdout. See the module docstring for what is timed.")
    parser.add_argument("--model", choices=torch_models.MODEL_NAMES, default="mlp",
                        help="model (default %(default)s)")
    parser.add_argument("--hidden", default="256",
                        help="mlp hidden sizes, e.g. 256 or 512,256 (default %(default)s)")
    parser.add_argument("--data", default=torch_models.FASHION_MNIST_DIR,
                        help="Fashion-MNIST folder, or 'synthetic' (default %(default)s)")
    parser.add_argument("--synthetic-size", type=positive_int, default=10000,
                        help="samples of --data synthetic (default %(default)s)")
    parser.add_argument("--batch", "--batch-size", dest="batch", type=positive_int, default=64,
                        help="samples per step (per rank) (default %(default)s)")
    parser.add_argument("--steps", type=positive_int, default=600,
                        help="timed training steps (default %(default)s)")
    parser.add_argument("--warmup", type=int, default=20,
                        help="untimed steps before timing (default %(default)s)")
    parser.add_argument("--threads", type=positive_int, default=1,
                        help="torch.set_num_threads (default %(default)s)")
    parser.add_argument("--lr", type=float, default=0.02, help="constant lr (default %(default)s)")
    parser.add_argument("--momentum", type=float, default=0.9,
                        help="SGD momentum (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="init and shuffle seed (default 0)")
    parser.add_argument("--bucket-cap-mb", type=float, default=25.0,
                        help="DistributedDataParallel bucket_cap_mb (default %(default)s)")
    parser.add_argument("--device", default="cpu",
                        help="cpu, cuda or cuda:N (default %(default)s)")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                        help="bf16: forward and loss under torch.autocast(device, bfloat16), "
                             "the peer of ddp's train --precision bf16 (default %(default)s)")
    parser.add_argument("--sync-every", type=positive_int, default=1,
                        help="read the loss (loss.item()) every N steps (default %(default)s)")
    args = parser.parse_args(argv)
    if args.warmup < 0:
        parser.error("--warmup must be >= 0")
    try:
        args.hidden = [int(x) for x in args.hidden.split(",")]
        assert all(h > 0 for h in args.hidden)
    except (ValueError, AssertionError):
        parser.error(f"--hidden '{args.hidden}': expected positive sizes like 256 or 512,256")
    if not (args.device == "cpu" or args.device == "cuda" or args.device.startswith("cuda:")):
        parser.error(f"--device '{args.device}': valid values are cpu, cuda, cuda:N")
    return args


def resolve_device(name):
    """The torch.device for --device; exits with the reason when CUDA is unusable."""
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            sys.exit(f"torch_train: --device {name}: torch.cuda.is_available() is False "
                     f"(torch {torch.__version__}, built for CUDA {torch.version.cuda})")
        if device.index is not None and device.index >= torch.cuda.device_count():
            sys.exit(f"torch_train: --device {name}: this machine has "
                     f"{torch.cuda.device_count()} CUDA device(s)")
    return device


def init_distributed():
    """(rank, world_size); initializes gloo when WORLD_SIZE > 1."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return 0, 1
    import torch.distributed as dist
    for var in ("RANK", "MASTER_ADDR", "MASTER_PORT"):
        if var not in os.environ:
            sys.exit(f"torch_train: WORLD_SIZE={world_size} needs {var} in the environment")
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    return rank, world_size


def batches(inputs, labels, batch, seed, rank, world_size, device):
    """Endless batches: each epoch a new permutation, this rank's shard, sliced;
    on a GPU each batch pinned and copied asynchronously."""
    epoch = 0
    on_gpu = device.type == "cuda"
    while True:
        gen = torch.Generator().manual_seed(seed + epoch)
        perm = torch.randperm(len(labels), generator=gen)[rank::world_size]
        x, y = inputs[perm], labels[perm]  # the loader's gather, once per epoch
        for i in range(0, len(y), batch):
            xb, yb = x[i:i + batch], y[i:i + batch]
            if on_gpu:
                xb = xb.pin_memory().to(device, non_blocking=True)
                yb = yb.pin_memory().to(device, non_blocking=True)
            yield xb, yb
        epoch += 1


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    rank, world_size = init_distributed()
    device = resolve_device(args.device)
    torch.manual_seed(args.seed)

    if args.data == "synthetic":
        inputs, labels = torch_models.make_synthetic(args.synthetic_size)
    else:
        inputs, labels = torch_models.load_fashion_mnist(args.data, "train")
    model = torch_models.build(args.model, hidden=args.hidden).to(device)
    if world_size > 1:
        model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=args.bucket_cap_mb)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)

    autocast_bf16 = args.precision == "bf16"

    def step(x, y, read_loss):
        optimizer.zero_grad(set_to_none=False)  # zero in place, as ddp's zero_grad does
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast_bf16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss.item() if read_loss else None

    stream = batches(inputs, labels, args.batch, args.seed, rank, world_size, device)
    for _ in range(args.warmup):
        step(*next(stream), True)
    if world_size > 1:
        torch.distributed.barrier()
    synchronize(device)
    samples = 0
    loss = 0.0
    start = time.perf_counter()
    for i in range(args.steps):
        x, y = next(stream)
        value = step(x, y, (i + 1) % args.sync_every == 0 or i + 1 == args.steps)
        loss = loss if value is None else value
        samples += len(y)
    synchronize(device)
    elapsed = time.perf_counter() - start

    if rank == 0:
        print(json.dumps({
            "impl": "torch",
            "model": args.model,
            "batch": args.batch,
            "threads": args.threads,
            "samples_per_s": round(samples * world_size / elapsed, 1),
            "step_ms": round(1e3 * elapsed / args.steps, 4),
            "steps": args.steps,
            "warmup": args.warmup,
            "world_size": world_size,
            "bucket_cap_mb": args.bucket_cap_mb,
            "last_loss": round(loss, 4),
            "torch": torch.__version__,
            "device": str(device),
            "sync_every": args.sync_every,
            "precision": args.precision,
            "data": "synthetic" if args.data == "synthetic" else "fashion-mnist",
        }), flush=True)
    if world_size > 1:
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
