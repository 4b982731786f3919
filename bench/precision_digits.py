#!/usr/bin/python3
"""The digits example in fp32 and in bf16, seed by seed: the test accuracy of each and their mean over the seeds, and
the training loss per epoch as a Markdown table (the curves docs/mixed-precision.md shows).

usage: bench/precision_digits.py [--build build] [--seeds 0-5] [--epochs 20] [--world-size 2] [--precisions fp32,bf16]
                                 [--data ../shared/data/digits.csv.gz] [--curves-seed 0]

Each seed runs every precision one after the other. The target: bf16's mean test accuracy within 0.5 points of fp32's.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def seeds_from(text):
    first, _, last = text.partition("-")
    return list(range(int(first), int(last or first) + 1))


def run_digits(binary, data, precision, seed, epochs, world):
    command = [binary, "--data", data, "--precision", precision, "--seed", str(seed), "--epochs", str(epochs),
               "--world-size", str(world)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    text = done.stdout + done.stderr
    accuracy = float(re.search(r"test accuracy ([0-9.]+)", text).group(1))
    losses = {}  # epoch -> the last train loss its progress line showed
    for epoch, loss in re.findall(r"epoch\s+(\d+)/\d+\s+train(?:\s+\d+/\d+)?\s+loss ([0-9.]+)", text):
        losses[int(epoch)] = float(loss)
    units = re.search(r"\[precision\][^\n]*", text)
    return accuracy, [losses[e] for e in sorted(losses)], units.group(0) if units else ""


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", default=os.path.join(TOP, "build"))
    parser.add_argument("--seeds", default="0-5")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--data", default=None)
    parser.add_argument("--curves-seed", type=int, default=0)
    args = parser.parse_args()
    binary = os.path.join(args.build, "bin", "digits")
    data = args.data
    if data is None:
        for candidate in [os.environ.get("TINYDDP_DIGITS", ""), os.path.join(TOP, "..", "shared", "data", "digits.csv.gz"),
                          os.path.join(TOP, "data", "digits.csv.gz")]:
            if candidate and os.path.exists(candidate):
                data = candidate
                break
    if not data:
        sys.exit("no digits data: run `make data`, or pass --data")
    precisions = args.precisions.split(",")
    model = re.search(r"model name\s*:\s*(.*)", open("/proc/cpuinfo").read()).group(1)
    print(f"digits, {args.world_size} workers, {args.epochs} epochs; CPU: {model}; load {os.getloadavg()[0]:.2f}")
    accuracy = {p: [] for p in precisions}
    curves = {}
    for seed in seeds_from(args.seeds):
        row = []
        for precision in precisions:
            acc, losses, units = run_digits(binary, data, precision, seed, args.epochs, args.world_size)
            accuracy[precision].append(acc)
            if seed == args.curves_seed:
                curves[precision] = losses
            if units and seed == seeds_from(args.seeds)[0]:
                print(f"  {units}")
            row.append(f"{precision} {100 * acc:.2f}%")
        print(f"  seed {seed}: " + "  ".join(row), flush=True)
    print("\nmean test accuracy over the seeds:")
    for precision in precisions:
        print(f"  {precision}: {100 * statistics.mean(accuracy[precision]):.2f}%"
              f"  (min {100 * min(accuracy[precision]):.2f}, max {100 * max(accuracy[precision]):.2f})")
    if len(precisions) >= 2:
        a, b = precisions[0], precisions[1]
        gap = 100 * (statistics.mean(accuracy[b]) - statistics.mean(accuracy[a]))
        print(f"  {b} - {a}: {gap:+.2f} points (target: within 0.5)")
    if curves:
        print(f"\ntraining loss per epoch, seed {args.curves_seed}:\n")
        print("| epoch | " + " | ".join(precisions) + " |")
        print("|---|" + "---|" * len(precisions))
        for e in range(len(next(iter(curves.values())))):
            print(f"| {e + 1} | " + " | ".join(f"{curves[p][e]:.4f}" for p in precisions) + " |")
    print(f"\nload after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
