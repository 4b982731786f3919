#!/usr/bin/python3
"""tinyddp's training step in fp32, bf16 and fp16 against PyTorch's fp32 and torch.autocast(bf16), side by side.

usage: bench/compare_precision.py [--build build] [--rounds 3] [--shapes reference|all] [--world 2]

For each shape, each round runs, one after another (so a neighbour's load on a shared host falls on all alike):
  tinyddp   build/bin/train_bench --precision P --world-size W   (one process, then W ranks; P = fp32, bf16, fp16)
  PyTorch   bench/peers/torch_train.py --precision P --world 1, then W   (P = fp32, bf16 autocast)
then prints each one's median samples/s and the ratios the targets are set on:
  ours (fastest mode) / PyTorch's fastest, on one core and on W ranks (samples/s per job, batch per rank).
PyTorch's autocast bf16 is run on a sample count cut to --torch-bf16-fraction of the job where the CPU has no bf16
units (there it is a slow emulation; the rate, not the total, is compared).
Shapes: the reference MLP 784-1024-1024-10 at batch 256, and with --shapes all also wider layers (784-2048-2048-10),
a smaller batch (64) and 100 classes.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SHAPES = {
    "784-1024-1024-10 b256": dict(inputs=784, hidden=1024, out=10, batch=256, samples=16384),
    "784-2048-2048-10 b256": dict(inputs=784, hidden=2048, out=10, batch=256, samples=8192),
    "784-1024-1024-10 b64": dict(inputs=784, hidden=1024, out=10, batch=64, samples=8192),
    "784-1024-1024-100 b256": dict(inputs=784, hidden=1024, out=100, batch=256, samples=16384),
}


def run(command, env=None):
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return done.stdout


def rate(text, pattern):
    match = re.search(pattern, text)
    return float(match.group(1)) if match else None


def cpu_has_bf16_units():
    flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split()
    return "avx512_bf16" in flags or "amx_bf16" in flags


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", default=os.path.join(TOP, "build"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shapes", choices=["reference", "all"], default="reference")
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--torch-bf16-fraction", type=float, default=None,
                        help="fraction of the samples PyTorch's autocast runs (default: 1 with bf16 units, else 1/16)")
    parser.add_argument("--ours", default="fp32,bf16,fp16")
    parser.add_argument("--samples", type=int, default=None, help="samples per job (default: each shape's own)")
    args = parser.parse_args()
    bench = os.path.join(args.build, "bin", "train_bench")
    peer = os.path.join(TOP, "bench", "peers", "torch_train.py")
    if not os.path.exists(bench):
        sys.exit(f"{bench} does not exist; build it first (make build)")
    fraction = args.torch_bf16_fraction or (1.0 if cpu_has_bf16_units() else 1 / 16)
    model = re.search(r"model name\s*:\s*(.*)", open("/proc/cpuinfo").read()).group(1)
    print(f"CPU: {model}, {os.cpu_count()} cores; bf16 units: {'yes' if cpu_has_bf16_units() else 'no'}")
    print(f"load before: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    ours_modes = args.ours.split(",")
    shapes = ["784-1024-1024-10 b256"] if args.shapes == "reference" else list(SHAPES)
    for name in shapes:
        s = dict(SHAPES[name])
        if args.samples:
            s["samples"] = args.samples
        job = ["--in", str(s["inputs"]), "--hidden", str(s["hidden"]), "--out", str(s["out"]),
               "--batch-size", str(s["batch"]), "--epochs", str(args.epochs)]
        rates = {}  # (side, precision, world) -> [samples/s per round]
        loads = []  # the 1-minute load average as each round starts: beside every figure on a shared host
        for _ in range(args.rounds):
            loads.append(os.getloadavg()[0])
            for precision in ours_modes:
                text = run([bench, *job, "--samples", str(s["samples"]), "--precision", precision,
                            "--world-size", str(args.world), "--interleaved", "0",
                            "--scaling-rounds", "1"])  # its rounds are this script's: one pair a round
                rates.setdefault(("tinyddp", precision, 1), []).append(rate(text, r"training\s*:.*?(\d+) samples/s"))
                rates.setdefault(("tinyddp", precision, args.world), []).append(
                    rate(text, r"data-parallel :.*?(\d+) samples/s"))
            for precision in ["fp32", "bf16"]:
                samples = s["samples"] if precision == "fp32" else max(s["batch"] * 4, int(s["samples"] * fraction))
                for world in [1, args.world]:
                    text = run(["/usr/bin/python3", peer, "--precision", precision, "--world", str(world),
                                "--in", str(s["inputs"]), "--hidden", str(s["hidden"]), "--out", str(s["out"]),
                                "--batch", str(s["batch"]), "--samples", str(samples), "--epochs", str(args.epochs)])
                    rates.setdefault(("PyTorch", precision, world), []).append(rate(text, r"(\d+) samples/s"))
        print(f"\n{name}, {args.rounds} rounds, median samples/s (min-max); load as the rounds began: "
              + " ".join(f"{load:.1f}" for load in loads))
        median = {key: statistics.median(values) for key, values in rates.items()}
        for (side, precision, world), values in sorted(rates.items(), key=lambda kv: (kv[0][2], kv[0][0], kv[0][1])):
            print(f"  {side:8s} {precision:5s} world {world}: {median[(side, precision, world)]:8.0f}"
                  f"  ({min(values):.0f}-{max(values):.0f})")
        for world in [1, args.world]:
            ours = max((median[("tinyddp", p, world)], p) for p in ours_modes)
            theirs = max((median[("PyTorch", p, world)], p) for p in ["fp32", "bf16"])
            print(f"  world {world}: ours fastest ({ours[1]}) / PyTorch fastest ({theirs[1]}) = {ours[0] / theirs[0]:.2f}x")
    print(f"\nload after: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")


if __name__ == "__main__":
    main()
