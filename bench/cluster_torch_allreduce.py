#!/usr/bin/python3
"""One rank of PyTorch's gloo all-reduce on a multi-host job (bench/compare_cluster.sh starts one per
rank on each simulated host). RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the environment, as
torchrun sets them; argv: the largest size in bytes. Rank 0 prints rows like ../shared/anchors:
bytes, time_us, algbw GB/s, busbw GB/s (float32 sum, in place)."""
import os, sys, time
import torch, torch.distributed as dist

def main():
    max_bytes = int(sys.argv[1]) if len(sys.argv) > 1 else 16 << 20
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        print(f"# torch {torch.__version__} gloo all_reduce, world={world}\n#       bytes      time_us  algbw    busbw", flush=True)
    nbytes = 1024
    while nbytes <= max_bytes:
        t = torch.ones(nbytes // 4, dtype=torch.float32)
        n = max(3, min(50, int(4e8 // nbytes)))
        for _ in range(2): dist.all_reduce(t)
        dist.barrier(); t0 = time.perf_counter()
        for _ in range(n): dist.all_reduce(t)
        dt = (time.perf_counter() - t0) / n
        if rank == 0:
            algbw = nbytes / dt / 1e9
            print(f"{nbytes:>12} {dt*1e6:>12.1f} {algbw:>8.3f} {algbw*2*(world-1)/world:>8.3f}", flush=True)
        nbytes *= 4
    dist.destroy_process_group()

if __name__ == "__main__":
    main()
