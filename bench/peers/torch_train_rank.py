#!/usr/bin/python3
"""One rank of PyTorch DDP (gloo) training across simulated hosts: the job train_bench's data-parallel
part runs (MLP in-hidden-hidden-out, ReLU, cross-entropy, Adam lr 1e-3, cosine per batch, batch per
rank, a distributed sampler), one BLAS thread per rank. bench/cluster_train.sh starts one per rank on
each host with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (and GLOO_SOCKET_IFNAME) as torchrun sets
them. argv: IN HIDDEN OUT SAMPLES BATCH EPOCHS. Rank 0 prints the training time (between barriers,
as train_bench times rank 0 from its first batch) and the global samples/s."""
import math, os, sys, time
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import torch, torch.nn as nn, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

def main():
    i, h, o, n, b, e = map(int, sys.argv[1:7])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    x = torch.rand(n, i, generator=g)
    ds = TensorDataset(x, (x.mean(dim=1) > 0.5).long())
    model = DDP(nn.Sequential(nn.Linear(i, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, o)))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=e * math.ceil(n / world / b))
    sampler = DistributedSampler(ds, world, rank, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=b, sampler=sampler)
    lossf = nn.CrossEntropyLoss()
    dist.barrier()
    t0 = time.perf_counter()
    for epoch in range(e):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            opt.zero_grad(); loss = lossf(model(xb), yb); loss.backward(); opt.step(); sched.step()
    dist.barrier()
    dt = time.perf_counter() - t0
    if rank == 0:
        print(f"torch {torch.__version__} DDP gloo world={world}: {dt:.3f} s {n * e / dt:.0f} samples/s, last loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()

if __name__ == "__main__":
    main()
