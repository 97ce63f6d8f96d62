#!/usr/bin/python3
"""torch.distributed all_reduce timings (the peer of `bench allreduce`).

Launch one process per rank with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set
(torchrun is broken on Debian's Python 3.11), e.g. via bench/allreduce_sweep.sh.
Rank 0 prints one JSON line per size with the keys of `bench allreduce --json`:
bytes, time_us, algbw_gbps, busbw_gbps, backend, world_size.
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--min-bytes", type=int, default=4)
    parser.add_argument("--max-bytes", type=int, default=256 << 20)
    parser.add_argument("--iters", type=int, default=0,
                        help="timed iterations per size (default: about 0.2 s per size)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--backend", default="gloo")
    args = parser.parse_args()
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        if name not in os.environ:
            parser.error(f"{name} is not set: launch one process per rank with the torch "
                         "environment variables")
    torch.set_num_threads(1)
    dist.init_process_group(args.backend)
    rank, n = dist.get_rank(), dist.get_world_size()
    size = max(args.min_bytes, 4)
    while size <= args.max_bytes:
        count = size // 4
        t = torch.full((count,), float(rank + 1))
        iters = args.iters or min(max(200_000_000 // size, 5), 1000)
        for _ in range(args.warmup):
            dist.all_reduce(t)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        us = (time.perf_counter() - start) / iters * 1e6
        slowest = torch.tensor([us])
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        us = slowest.item()
        algbw = count * 4 / (us * 1e3)
        if rank == 0:
            print(json.dumps({"bytes": count * 4, "time_us": round(us, 2),
                              "algbw_gbps": round(algbw, 4),
                              "busbw_gbps": round(algbw * 2 * (n - 1) / n, 4),
                              "backend": "torch-" + args.backend, "world_size": n}), flush=True)
        size *= 2
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
