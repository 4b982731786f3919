#!/usr/bin/python3
"""PyTorch's side of bench/bf16_wire.sh's hook timings: its built-in DDP comm hooks
(torch.distributed.algorithms.ddp_comm_hooks.default_hooks: allreduce_hook, fp16_compress_hook,
bf16_compress_hook) each run on one bucket of MIB MiB of f32 gradients, over gloo, as
`bf16_wire --mode hooks` runs ours: the bucket refilled before each call, a barrier, then the time from
the call to the end of the returned future's wait (conversion, all-reduce, conversion back), the
slowest rank's. The hooks alternate within every round, a different one first each round. Two more
rows take fp16_compress_hook apart: the all-reduce of the f16 tensor alone, and its conversions
alone (to f16, the division, back to f32) without any communication.

A hook reads only bucket.buffer(), so a bucket here is a small object holding one flat tensor: the
hooks run unchanged, without a DDP model around them. A hook whose dtype the backend refuses (gloo in
PyTorch 1.13 has no bf16 all-reduce) is reported as refused, with the backend's message.

usage: RANK=r WORLD_SIZE=n MASTER_ADDR=a MASTER_PORT=p torch_comm_hook.py [MIB] [ROUNDS] [WARMUP]
       (one process per rank, environment as torchrun sets it; defaults 16 MiB, 10 rounds, 2 warm-up)
rank 0 prints a Markdown table: min / median / max ms and the median over allreduce_hook's."""
import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks


class Bucket:
    """What the default hooks use of dist.GradBucket: its flat buffer."""

    def __init__(self, buffer):
        self._buffer = buffer

    def buffer(self):
        return self._buffer


def gradients(count, rank, seed=7):
    """A signal shared by every rank plus noise of each rank's own, over three decades of magnitude."""
    shared = torch.Generator().manual_seed(seed)
    own = torch.Generator().manual_seed(seed * 1000003 + rank + 1)
    scale = torch.pow(10.0, torch.rand(count, generator=shared) * 3 - 3)
    return scale * (torch.randn(count, generator=shared) + torch.randn(count, generator=own))


def refusal(dtype):
    """None when the backend all-reduces `dtype`, else its message (every rank gets the same answer)."""
    try:
        dist.all_reduce(torch.ones(4, dtype=dtype))
        return None
    except RuntimeError as e:
        return str(e).splitlines()[0]


def convert_to_fp16_and_back(group, bucket):
    """fp16_compress_hook's arithmetic without its all-reduce, as a completed future."""
    buffer = bucket.buffer()
    buffer.copy_(buffer.to(torch.float16).div_(dist.get_world_size()))
    done = torch.futures.Future()
    done.set_result(buffer)
    return done


def run_rounds(hooks, grad, rounds, warmup):
    bucket = Bucket(grad.clone())
    seconds = {name: [] for name in hooks}
    slowest = torch.zeros(1, dtype=torch.float64)
    names = list(hooks)
    for r in range(warmup + rounds):
        for k in range(len(names)):
            name = names[(k + r) % len(names)]
            bucket.buffer().copy_(grad)
            dist.barrier()
            start = time.perf_counter()
            hooks[name](None, bucket).wait()
            slowest[0] = time.perf_counter() - start
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            if r >= warmup:
                seconds[name].append(slowest.item())
    return seconds


def main():
    torch.set_num_threads(1)
    mib = float(sys.argv[1]) if len(sys.argv) > 1 else 16.0
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    warmup = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    count = int(mib * (1 << 20) / 4)
    hooks = {"allreduce_hook": default_hooks.allreduce_hook, "fp16_compress_hook": default_hooks.fp16_compress_hook}
    half = torch.zeros(count, dtype=torch.float16)
    hooks["fp16 all_reduce alone"] = lambda group, bucket: dist.all_reduce(half, async_op=True).get_future()
    hooks["fp16 conversions alone"] = convert_to_fp16_and_back
    refused = {}
    for name, dtype, hook in [("bf16_compress_hook", torch.bfloat16, default_hooks.bf16_compress_hook)]:
        why = refusal(dtype)
        if why:
            refused[name] = why
        else:
            hooks[name] = hook
    seconds = run_rounds(hooks, gradients(count, rank), rounds, warmup)
    if rank == 0:
        median = lambda s: sorted(s)[len(s) // 2]
        base = median(seconds["allreduce_hook"])
        print(f"torch {torch.__version__} gloo, {world} ranks, {mib:.1f} MiB of f32 ({count} elements), "
              f"{rounds} rounds after {warmup} warm-up")
        print("| variant | min ms | median ms | max ms | median / f32 |\n|---|---|---|---|---|")
        for name, s in seconds.items():
            print(f"| {name} | {min(s) * 1e3:.1f} | {median(s) * 1e3:.1f} | {max(s) * 1e3:.1f} | {median(s) / base:.2f} |")
        for name, why in refused.items():
            print(f"| {name} | refused by gloo: {why} | | | |")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
