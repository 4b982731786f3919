#!/usr/bin/python3
"""PyTorch's side of train_bench: the same MLP training job in PyTorch, one process or DDP (gloo), in fp32 or
under torch.autocast("cpu", torch.bfloat16) -- PyTorch's mixed precision on the CPU.

usage: torch_train.py [--world 1|2] [--precision fp32|bf16] [--in 784] [--hidden 1024] [--out 10]
                      [--samples 16384] [--batch 256] [--epochs 2]
       torch_train.py WORLD IN HIDDEN OUT SAMPLES BATCH EPOCHS     (train_bench --torch-anchor's form)
TORCH_AUTOCAST=bf16 in the environment makes bf16 the default precision.

The model is Linear(in, hidden)-ReLU-Linear(hidden, hidden)-ReLU-Linear(hidden, out) (Linear(in, out) with
--hidden 0, the seed job's), cross-entropy, Adam(1e-3),
cosine annealing stepped per batch, a DistributedSampler with shuffling: what build/bin/train_bench trains.
Prints one line:
  torch_train world=W precision=P model=I-H-H-O batch=B openblas=CORE train 1.234s 13278 samples/s loss 0.6931

Debian's PyTorch computes fp32 Linear with OpenBLAS. Two settings decide its speed, both set here before torch loads
(each only when the caller has not set it):
  OPENBLAS_NUM_THREADS=1   torch.set_num_threads(1) does not bound OpenBLAS; one thread per process, as tinyddp runs.
  OPENBLAS_CORETYPE        the best kernel family this CPU runs: SkylakeX with AVX-512, Haswell with AVX2 (Zen
                           included: OpenBLAS's Zen family runs its Haswell kernels). Debian's OpenBLAS 0.3.21 falls
                           back to its generic Prescott kernel on CPUs newer than it, at a fraction of the speed.
"""
import argparse
import math
import os
import sys
import time


def best_openblas_coretype():
    try:
        flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return None
    if all(f in flags for f in ("avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl")):
        return "SkylakeX"
    if "avx2" in flags and "fma" in flags:
        return "Haswell"
    return None


os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
if "OPENBLAS_CORETYPE" not in os.environ and best_openblas_coretype():
    os.environ["OPENBLAS_CORETYPE"] = best_openblas_coretype()

import ctypes  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402
from torch.utils.data.distributed import DistributedSampler  # noqa: E402


def openblas_core():
    """The kernel family the OpenBLAS that torch loaded runs, as it says it."""
    try:
        lib = ctypes.CDLL("libopenblas.so.0")
        lib.openblas_get_corename.restype = ctypes.c_char_p
        return lib.openblas_get_corename().decode()
    except (OSError, AttributeError):
        return "unknown"


def make_model(i, h, o):
    if h == 0:
        return nn.Linear(i, o)
    return nn.Sequential(nn.Linear(i, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, o))


def make_data(n, i, o):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(n, i, generator=g)
    y = torch.randint(0, o, (n,), generator=g)
    return TensorDataset(x, y)


def train(rank, world, args, port, results):
    torch.set_num_threads(1)
    if world > 1:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    dataset = make_data(args.samples, args.inputs, args.out)
    model = make_model(args.inputs, args.hidden, args.out)
    if world > 1:
        model = DistributedDataParallel(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    sampler = DistributedSampler(dataset, world, rank, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch, sampler=sampler)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs * len(loader))
    loss_fn = nn.CrossEntropyLoss()
    autocast = args.precision == "bf16"
    if world > 1:
        dist.barrier()
    start = time.perf_counter()
    loss = torch.zeros(())
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            scheduler.step()
    if world > 1:
        dist.barrier()
    seconds = time.perf_counter() - start
    if rank == 0:
        results.put((seconds, float(loss)))
    if world > 1:
        dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--world", type=int, default=1, choices=[1, 2, 3, 4])
    parser.add_argument("--precision", default="bf16" if os.environ.get("TORCH_AUTOCAST") == "bf16" else "fp32",
                        choices=["fp32", "bf16"])
    parser.add_argument("--in", dest="inputs", type=int, default=784)
    parser.add_argument("--hidden", type=int, default=1024, help="0: a single Linear(in, out)")
    parser.add_argument("--out", type=int, default=10)
    parser.add_argument("--samples", type=int, default=16384)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--port", type=int, default=29541)
    argv = sys.argv[1:]
    if len(argv) == 7 and all(a.isdigit() for a in argv):  # WORLD IN HIDDEN OUT SAMPLES BATCH EPOCHS
        argv = [f"--{name}={value}" for name, value in zip(["world", "in", "hidden", "out", "samples", "batch", "epochs"], argv)]
    args = parser.parse_args(argv)
    context = mp.get_context("spawn")
    results = context.SimpleQueue()
    if args.world == 1:
        train(0, 1, args, args.port, results)
    else:
        mp.spawn(train, args=(args.world, args, args.port, results), nprocs=args.world, join=True)
    seconds, loss = results.get()
    layers = (f"{args.inputs}-{args.out}" if args.hidden == 0
              else f"{args.inputs}-{args.hidden}-{args.hidden}-{args.out}")
    rate = args.samples * args.epochs / seconds
    print(f"torch_train world={args.world} precision={args.precision} "
          f"model={layers} batch={args.batch} openblas={openblas_core()} "
          f"train {seconds:.3f}s {rate:.0f} samples/s loss {loss:.4f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
