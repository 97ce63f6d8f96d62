"""An ordinary PyTorch DDP program, as a user would write it for torchrun; the
e2e test tests/e2e/ddprun_torch.sh runs it, unmodified, under ddprun.

  init_process_group("gloo") from the environment (env://: rank 0 hosts the
  store on MASTER_PORT), an all_reduce of rank + 1 checked against
  W(W+1)/2, and 3 SGD steps of a DistributedDataParallel linear model whose
  weights must equal, on every rank, one process trained on every rank's batch.

  --fail-first-attempt  rank 1 exits 3 in attempt 0 (TORCHELASTIC_RESTART_COUNT 0),
                        after the all_reduce; attempt 1 checks the restart variables
Prints "ok rank=R world=W allreduce=S restart=K" and exits 0, else raises.
"""
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

BATCH = 4  # per rank
STEPS = 3


def batch_of(rank):
    """Rank r's inputs and targets: a closed form, so any rank can rebuild all."""
    x = torch.arange(BATCH * 3, dtype=torch.float64).reshape(BATCH, 3) / 10 + rank
    y = x.sum(dim=1, keepdim=True) * 0.5 - rank
    return x, y


def make_model():
    torch.manual_seed(1234)
    return nn.Linear(3, 1).double()


def train(model, batches):
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(STEPS):
        opt.zero_grad()
        loss = sum(nn.functional.mse_loss(model(x), y) for x, y in batches) / len(batches)
        loss.backward()
        opt.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    assert os.environ["TORCHELASTIC_USE_AGENT_STORE"] == "False", "rank 0 must host its store"
    if rank == 0:
        # Nothing may listen on MASTER_PORT before rank 0 does. SO_REUSEADDR, as
        # torch's own store: the previous attempt's connections may be in TIME_WAIT,
        # but a listening socket still makes bind fail.
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])))
    dist.init_process_group("gloo")
    assert dist.get_rank() == rank and dist.get_world_size() == world

    t = torch.tensor([rank + 1.0], dtype=torch.float64)
    dist.all_reduce(t)
    expected = world * (world + 1) / 2
    assert t.item() == expected, f"rank {rank}: all_reduce gave {t.item()}, expected {expected}"

    if "--fail-first-attempt" in sys.argv:
        if restart == 0 and rank == 1:
            print(f"rank {rank}: failing on purpose in attempt 0", flush=True)
            sys.exit(3)
        assert restart == 0 or restart == 1, f"TORCHELASTIC_RESTART_COUNT={restart}"
        assert os.environ["TORCHELASTIC_MAX_RESTARTS"] == "1"

    ddp = DistributedDataParallel(make_model())
    weights = train(ddp, [batch_of(rank)])
    reference = train(make_model(), [batch_of(r) for r in range(world)])
    assert torch.allclose(weights, reference, rtol=0, atol=1e-12), (
        f"rank {rank}: DDP weights {weights.tolist()} != one process's {reference.tolist()}")
    gathered = [torch.empty_like(weights) for _ in range(world)]
    dist.all_gather(gathered, weights)
    for r, w in enumerate(gathered):
        assert torch.equal(w, weights), f"rank {r}'s weights {w.tolist()} != rank {rank}'s"
    dist.destroy_process_group()
    print(f"ok rank={rank} world={world} allreduce={t.item():g} restart={restart}", flush=True)


if __name__ == "__main__":
    main()
