#!/usr/bin/python3
"""PyTorch's side of bench/compare_zero.sh: DDP (gloo, CPU) training of the MLP IN-H-H-10 with Adam, the
optimizer either plain torch.optim.Adam (every rank holds the whole state) or
torch.distributed.optim.ZeroRedundancyOptimizer wrapping Adam (each rank holds the state of its share
of the parameters). The job of train_bench's data-parallel part: the same model, data of the same kind
(uniform features, label: mean above 0.5), batch per rank, Adam lr 1e-3, a cosine schedule stepped per
batch over each rank's batches, one thread per process.

usage: torch_zero_train.py WORLD IN HIDDEN OUT SAMPLES BATCH EPOCHS ZERO   (ZERO: 0 or 1)
prints one line: train seconds (rank 0, between barriers, as train_bench times its ranks), the mean
training loss of the last epoch over every rank, and each rank's optimizer state bytes (the nbytes of
the tensors in the local optimizer's state: exp_avg, exp_avg_sq and Adam's 4-byte step counters)."""
import math
import os
import socket
import sys
import time

# Debian's PyTorch calls OpenBLAS for Linear, and torch.set_num_threads(1) does not bound it.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def make_mlp(i, h, o):
    return nn.Sequential(nn.Linear(i, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, o))


def make_data(n, i):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(n, i, generator=g)
    return TensorDataset(x, (x.mean(dim=1) > 0.5).long())


def state_bytes(optimizer):
    local = optimizer.optim if isinstance(optimizer, ZeroRedundancyOptimizer) else optimizer
    return sum(t.numel() * t.element_size() for s in local.state.values() for t in s.values() if torch.is_tensor(t))


def worker(rank, world, port, i, h, o, n, b, e, zero, queue):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    data = make_data(n, i)
    model = DDP(make_mlp(i, h, o))
    if zero:
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    sampler = DistributedSampler(data, world, rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=b, sampler=sampler)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=e * math.ceil(len(sampler) / b))
    loss_fn = nn.CrossEntropyLoss()
    dist.barrier()
    t0 = time.perf_counter()
    for epoch in range(e):
        sampler.set_epoch(epoch)
        sums = torch.zeros(2, dtype=torch.float64)  # the epoch's loss sum and batch count on this rank
        for x, y in loader:
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            sched.step()
            sums += torch.tensor([loss.item(), 1.0], dtype=torch.float64)
    dist.barrier()
    seconds = time.perf_counter() - t0
    dist.all_reduce(sums)
    queue.put((rank, seconds, (sums[0] / sums[1]).item(), state_bytes(opt)))
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    if len(sys.argv) != 9:
        sys.exit(__doc__)
    w, i, h, o, n, b, e, zero = map(int, sys.argv[1:9])
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.spawn(worker, args=(w, free_port(), i, h, o, n, b, e, zero, queue), nprocs=w)
    results = sorted(queue.get() for _ in range(w))
    _, seconds, loss, _ = results[0]
    per_rank = " ".join(str(r[3]) for r in results)
    print(f"torch {torch.__version__} {'ZeroRedundancyOptimizer(Adam)' if zero else 'Adam'} world={w} "
          f"model={i}-{h}-{h}-{o} n={n} batch={b} epochs={e}: train {seconds:.3f} s, last epoch loss {loss:.4f}, "
          f"optimizer state bytes per rank {per_rank}")


if __name__ == "__main__":
    main()
