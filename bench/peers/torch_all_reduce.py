#!/usr/bin/python3
"""PyTorch's all-reduce on CPU tensors (torch.distributed, gloo backend): the peer of
`all_reduce_perf --transport tcp` that most DDP users run. float32 sum, in place, sizes MIN_BYTES to
MAX_BYTES by x4.

Two ways to start it:
  torch_all_reduce.py [--world N] ...          spawns N local ranks itself (torch.multiprocessing),
                                               rendezvous on 127.0.0.1 and a free port
  RANK=r WORLD_SIZE=n MASTER_ADDR=a MASTER_PORT=p torch_all_reduce.py ...
                                               one rank, as torchrun or a per-host script starts it
                                               (bench/compare_cluster.sh, across simulated hosts)

Rank 0 prints a header line "# torch <version> gloo all_reduce, world=N", then one row per size:
bytes, time_us, algbw (GB/s), busbw (GB/s) = algbw * 2(n-1)/n as in nccl-tests. The time is rank 0's
mean over the timed calls, after 2 warm-up calls and a barrier. Before timing a size, every rank
all-reduces rank + 1 once and checks that every element came back as n(n+1)/2: a wrong result
stops the run with a message, it never prints as a figure."""
import argparse
import os
import re
import socket
import sys
import time

# One thread per rank, as each of our ranks runs one (and Debian's PyTorch's OpenBLAS is not bounded
# by torch.set_num_threads).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def byte_count(text):
    """'4096', '4K', '16M', '1G' (powers of 1024, as nccl-tests reads -b and -e)."""
    match = re.fullmatch(r"(\d+)([KMG]?)", text.strip().upper())
    if not match:
        raise argparse.ArgumentTypeError(f"'{text}' is not a byte count (e.g. 4096, 64K, 16M)")
    return int(match.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[match.group(2)]


def sizes(min_bytes, max_bytes):
    nbytes = min_bytes
    while nbytes <= max_bytes:
        yield nbytes
        nbytes *= 4


def iterations(nbytes, most):
    """At most `most` timed calls, fewer for large sizes (about 2 GB moved per size), at least 2."""
    return max(2, min(most, 2_000_000_000 // nbytes))


def check(tensor, rank, world):
    tensor.fill_(rank + 1)
    dist.all_reduce(tensor)
    expected = world * (world + 1) / 2
    wrong = int((tensor != expected).sum())
    if wrong:
        raise RuntimeError(f"torch_all_reduce: rank {rank}: {wrong} of {tensor.numel()} elements are not "
                           f"{expected} after all-reducing rank + 1 over {world} ranks")


def measure(args):
    """The body of one rank, once the process group is up."""
    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        print(f"# torch {torch.__version__} gloo all_reduce, float32 sum, in place, world={world}\n"
              f"#       bytes      time_us  algbw    busbw", flush=True)
    for nbytes in sizes(args.min_bytes, args.max_bytes):
        tensor = torch.empty(nbytes // 4, dtype=torch.float32)
        check(tensor, rank, world)
        tensor.zero_()  # timed calls sum zeros: repeated in-place sums of ones would grow to inf at many ranks
        n = iterations(nbytes, args.iters)
        for _ in range(2):
            dist.all_reduce(tensor)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(n):
            dist.all_reduce(tensor)
        seconds = (time.perf_counter() - start) / n
        if rank == 0:
            algbw = nbytes / seconds / 1e9
            print(f"{nbytes:>12} {seconds * 1e6:>12.1f} {algbw:>8.3f} {algbw * 2 * (world - 1) / world:>8.3f}",
                  flush=True)
    dist.destroy_process_group()


def spawned_rank(rank, world, port, args):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    measure(args)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2, help="local ranks to spawn (ignored when RANK is set)")
    parser.add_argument("--min-bytes", type=byte_count, default=1024, help="smallest size, a multiple of 4 (1K)")
    parser.add_argument("--max-bytes", type=byte_count, default=256 << 20, help="largest size (256M)")
    parser.add_argument("--iters", type=int, default=50, help="timed calls per size, at most")
    args = parser.parse_args()
    if args.min_bytes < 4 or args.min_bytes % 4 or args.max_bytes < args.min_bytes:
        parser.error(f"sizes {args.min_bytes}..{args.max_bytes}: the smallest must be a positive multiple of 4 "
                     f"(float32) and not above the largest")
    if args.world < 1 or args.iters < 1:
        parser.error("--world and --iters must be at least 1")
    if "RANK" in os.environ:
        dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the environment
        measure(args)
    else:
        mp.spawn(spawned_rank, args=(args.world, free_port(), args), nprocs=args.world)


if __name__ == "__main__":
    sys.exit(main())
