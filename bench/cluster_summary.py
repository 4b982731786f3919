#!/usr/bin/python3
"""Summarises bench/compare_cluster.sh's raw tables (OUT/*.txt; the published ones: docs/results/cluster/) as markdown:
per layout and link profile, the in-place all-reduce time of each of our algorithms beside Gloo's
PyTorch gloo's and Open MPI's (median over rounds), the ratios, and the cost model's prediction.
usage: [CALL_US=us] cluster_summary.py RESULTS_DIR [COLLECTIVE_MODEL_BINARY]
CALL_US replaces the model's per-call term (collective_model --call-us) in the predictions."""
import collections, os, re, statistics, subprocess, sys

PEERS = ("gloo", "torch", "mpi")
RATES = {"1gbit": 1.0, "5gbit": 5.0, "none": 10.0}  # Gbit/s given to the model ("none": unshaped veth)

def parse(path):
    """{peer: {bytes: [time_us, ...]}}"""
    runs = collections.defaultdict(lambda: collections.defaultdict(list))
    peer = None
    for line in open(path):
        m = re.match(r"## (ours (\S+)|gloo|torch|mpi) round", line)
        if m:
            peer = m.group(2) if m.group(2) else m.group(1)
            continue
        f = line.split()
        if not f or line.startswith("#") or peer is None:
            continue
        if len(f) >= 13 and f[2] == "float":  # nccl-tests row: in-place time is column 10
            runs[peer][int(f[0])].append(float(f[9]))
        elif len(f) == 9 and f[2] == "float":  # nccl-tests' in-place columns alone (mpi_all_reduce)
            runs[peer][int(f[0])].append(float(f[5]))
        elif len(f) == 4:
            runs[peer][int(f[0])].append(float(f[1]))
    return runs

def predicted(model_bin, hosts, per_host, model_args, sizes):
    if not model_bin or not os.path.exists(model_bin):
        return {}
    if os.environ.get("CALL_US"):
        model_args = [*model_args, "--call-us", os.environ["CALL_US"]]
    out = subprocess.run([model_bin, "--hosts", str(hosts), "--per-host", str(per_host), *model_args,
                          "-b", str(min(sizes)), "-e", str(max(sizes)), "-f", "4"], capture_output=True, text=True).stdout
    lines = [l for l in out.splitlines() if l.strip()]
    header = next((l for l in lines if l.split()[0] == "bytes"), "")
    names = re.findall(r"(\S+)_us", header)
    table = {}
    for l in lines:
        f = l.split()
        if l.startswith("#") or not f[0].replace(".", "").isdigit():
            continue
        table[int(float(f[0]))] = {n: float(f[1 + 2 * i]) for i, n in enumerate(names)}
        table[int(float(f[0]))]["auto"] = table[int(float(f[0]))].get(f[-1], float("nan"))
    return table

def write_plot_data(path, runs, sizes, world):
    """busbw (GB/s) against size, a column per line (bench/plot_cluster.gp): ours per algorithm, the peers."""
    names = {"gloo": "Gloo", "torch": "PyTorch-gloo", "mpi": "OpenMPI-tcp"}
    peers = [p for p in runs if p not in names] + [p for p in names if p in runs]
    with open(path, "w") as f:
        f.write("bytes " + " ".join(names.get(p, "ours-" + p) for p in peers) + "\n")
        for s in sizes:
            cells = []
            for p in peers:
                t = statistics.median(runs[p][s]) if runs[p].get(s) else None
                cells.append("NaN" if t is None else f"{s / (t * 1e-6) / 1e9 * 2 * (world - 1) / world:.5f}")
            f.write(f"{s} " + " ".join(cells) + "\n")

def fmt(us):
    return "-" if us is None else (f"{us/1000:.2f} ms" if us >= 10000 else f"{us:.0f} µs")

def main():
    results = sys.argv[1]
    model_bin = sys.argv[2] if len(sys.argv) > 2 else os.path.join(os.path.dirname(results), "..", "build", "bin", "collective_model")
    for name in sorted(os.listdir(results)):
        m = re.match(r"(\d+)x(\d+)-(\w+)\.txt$", name)
        if not m:
            continue
        hosts, per_host, profile = int(m.group(1)), int(m.group(2)), m.group(3)
        if profile == "bytes":
            continue
        runs = parse(os.path.join(results, name))
        ours = [p for p in runs if p not in PEERS]
        sizes = sorted({s for p in runs.values() for s in p})
        # The model the run's `auto` measured (compare_cluster.sh keeps it; the last round's values
        # win), else the built-in one told the profile's rate.
        measured = os.path.join(results, f"{hosts}x{per_host}-{profile}-model.txt")
        model_args = ["--model", measured] if os.path.exists(measured) and os.path.getsize(measured) else ["--gbit", str(RATES.get(profile, 10.0))]
        model = predicted(model_bin, hosts, per_host, model_args, sizes)
        if model_args[0] == "--model":
            print(f"\n### {hosts} hosts x {per_host}, link {profile}: the model measured at startup (last round)\n")
            print("```\n" + "".join(l for l in open(measured).readlines()[-6:] if not l.startswith("#")) + "```")
        print(f"\n### {hosts} hosts x {per_host} rank{'s' if per_host > 1 else ''}, link {profile}\n")
        print("| bytes | " + " | ".join(f"ours {p}" for p in ours) + " | Gloo | PyTorch gloo | Open MPI (tcp) | best ours / Gloo | "
              "auto / Gloo | auto / Open MPI | model: auto |")
        print("|---" * (len(ours) + 8) + "|")
        for s in sizes:
            med = {p: statistics.median(runs[p][s]) if runs[p].get(s) else None for p in runs}
            best = min((med[p] for p in ours if med[p] is not None), default=None)
            g, o = med.get("gloo"), med.get("mpi")
            ratio = lambda x, by=g: "-" if x is None or by is None else f"{x / by:.2f}"
            pred = model.get(s, {}).get("auto")
            print(f"| {s} | " + " | ".join(fmt(med[p]) for p in ours) + f" | {fmt(g)} | {fmt(med.get('torch'))} | {fmt(o)} | "
                  f"{ratio(best)} | {ratio(med.get('auto'))} | {ratio(med.get('auto'), o)} | {fmt(pred)} |")
        write_plot_data(os.path.join(results, f"{hosts}x{per_host}-{profile}.dat"), runs, sizes, hosts * per_host)
        if model and any(p != "auto" for p in ours):
            print(f"\nModel against measured (ours, predicted / measured):\n")
            print("| bytes | " + " | ".join(p for p in ours if p != "auto") + " |")
            print("|---" * len([p for p in ours if p != "auto"]) + "|---|")
            for s in sizes:
                cells = []
                for p in ours:
                    if p == "auto":
                        continue
                    meas = statistics.median(runs[p][s]) if runs[p].get(s) else None
                    pred = model.get(s, {}).get(p)
                    cells.append("-" if meas is None or pred is None else f"{fmt(pred)} / {fmt(meas)} ({pred / meas:.2f})")
                print(f"| {s} | " + " | ".join(cells) + " |")
    for name in sorted(os.listdir(results)):
        if name.endswith("-bytes.txt"):
            print(f"\n### Bytes across hosts per 4 MiB all-reduce, {name[:-10]} (all hosts' eth0 tx)\n")
            print("| algorithm | measured payload | measured on the wire | model | payload / model |\n|---|---|---|---|---|")
            for line in open(os.path.join(results, name)):
                if line.startswith("#"):
                    continue
                algo, payload, wire, theory = line.split()
                print(f"| {algo} | {int(payload)} | {int(wire)} | {int(float(theory))} | {int(payload) / float(theory):.3f} |")

if __name__ == "__main__":
    main()
