#!/usr/bin/env bash
# All-reduce, tinyddp against its peers, side by side in one run (these hosts are shared and noisy:
# only figures taken together are compared). For each world size it runs
#   - the physical limits of the host: one core's memcpy and a+=b (bench/memory_limits), one loopback
#     TCP stream and two in opposite directions at once (bench/tcp_limits: what a 2-rank all-reduce
#     over tcp needs, every rank sending and receiving N bytes together), from and into
#     cache-resident chunks, and from and into 64 MiB buffers (the bytes of a large all-reduce
#     moved through memory, no reduction),
#   - the peers, from bench/peers/ (bench/peers/run_local.sh): Open MPI (shared memory), Gloo (TCP
#     ring), PyTorch's gloo backend,
#   - bench/all_reduce_perf over shm and over tcp, in place, float32 sum,
# then prints busbw (latency for the small sizes) per size with our ratios to the peers, and draws
# busbw against size for every line (bench/plot_allreduce.gp, gnuplot) into an SVG. For 2 ranks it
# also takes the 256 B - 4 KiB latency of ours (shm; launched back to back, and blocking, -z 1)
# and of Open MPI five times, alternating, and prints the medians (latency_w2.txt): a single
# figure of a few microseconds moves by 2-5x on a shared 2-core host.
#
# A peer that is not installed (scripts/deps.sh --bench installs them all) or that fails leaves its
# column empty, saying so: a peer's failure is never read as a figure. PEERS="mpi gloo torch" (the
# default) picks them; PEERS="" measures ours alone.
#
# usage: bench/compare_allreduce.sh [BUILD_DIR] [WORLD ...]        (default: build, worlds 2 4)
#        MIN=1K MAX=64K ITERS=20 LATENCY_RUNS=1 TCP_GIB=0.25 bench/compare_allreduce.sh build 2   (a quick look)
# output: BUILD_DIR/bench-allreduce/ (raw tables, CSV, nccl-tests JSON, summary.txt, allreduce_busbw_w<N>.svg)
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$top/build}" && pwd)
shift || true
worlds=${*:-2 4}
peers=${PEERS-mpi gloo torch}
MIN=${MIN:-1K}
MAX=${MAX:-256M}
ITERS=${ITERS:-}          # timed iterations of ours per size (default: 200 up to 4 MiB, 20 above)
LATENCY_RUNS=${LATENCY_RUNS:-5}
TCP_GIB=${TCP_GIB:-1}
run_peer=$top/bench/peers/run_local.sh
out=$build/bench-allreduce
mkdir -p "$out"
cmake --build "$build" --target all_reduce_perf tcp_limits -j "$(nproc)" >/dev/null
# The peers' programs, where their libraries were found (bench/peers/CMakeLists.txt); a missing one
# is reported by run_local.sh when its turn comes.
for program in gloo_all_reduce mpi_all_reduce memory_limits; do
  cmake --build "$build" --target "$program" -j "$(nproc)" >/dev/null 2>&1 || true
done
perf=$build/bin/all_reduce_perf
min_bytes=$(numfmt --from=iec "$MIN")
max_bytes=$(numfmt --from=iec "$MAX")
split=$((4 << 20))  # up to here ours takes 200 timed iterations (or ITERS), 20 above

# Runs all_reduce_perf on N local ranks: under tinyddp-run when it is built, else as a launcher
# would (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in each rank's environment).
launch() {
  local n=$1; shift
  if [ -x "$build/bin/tinyddp-run" ]; then
    "$build/bin/tinyddp-run" -n "$n" "$perf" "$@" | sed -e 's/^\[rank [0-9]*\] //'
  else
    local port=$((20000 + RANDOM % 20000)) r
    for ((r = 1; r < n; r++)); do
      RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$perf" "$@" >/dev/null &
    done
    RANK=0 WORLD_SIZE=$n LOCAL_RANK=0 LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$perf" "$@"
    wait
  fi
}

[ -n "$peers" ] || echo "(PEERS is empty: ours alone)"

# peer NAME WORLD FILE: the peer's table into FILE, shown. When the peer is not there or fails, FILE is
# emptied (nothing in it may be read as a figure) and one line says so.
peer() {
  local name=$1 world=$2 file=$3 status=0
  "$run_peer" "$build" "$name" "$world" "$MIN" "$MAX" >"$file" 2>"$file.err" || status=$?
  if [ $status -eq 0 ]; then
    cat "$file"
  elif [ $status -eq 3 ]; then
    echo "(peer $name skipped: $(tail -n 1 "$file.err"))"; : >"$file"
  else
    echo "(peer $name failed with status $status: no figures from it; its last lines:)"
    tail -n 3 "$file.err" | sed 's/^/    /'; : >"$file"
  fi
  rm -f "$file.err"
}

{
  if [ -x "$build/bin/memory_limits" ]; then "$build/bin/memory_limits" -b 64M -e 64M
  else echo "(no memory_limits built: bench/peers/memory_limits.cpp is not in this tree)"; fi
  "$build/bin/tcp_limits" --gib "$TCP_GIB"
} | tee "$out/limits.txt"

# Small-message latency, 2 ranks: ours over shm (back to back, then blocking) and Open MPI,
# LATENCY_RUNS times each (default 5), alternating; medians per size. Lines "name bytes us" on stdout;
# without the Open MPI peer, ours alone.
latency() {
  local rep have_mpi=0
  if [[ " $peers " == *" mpi "* ]] && [ -x "$build/bin/mpi_all_reduce" ] && command -v mpirun >/dev/null; then
    have_mpi=1
  else
    echo "(Open MPI peer not run: latency of ours alone)" >&2
  fi
  for ((rep = 1; rep <= LATENCY_RUNS; rep++)); do
    for z in 0 1; do
      launch 2 -b 256 -e 4K -f 4 -n 2000 -w 500 -d float -o sum --transport shm -c 0 -z "$z" \
        | awk -v z="$z" '$1 ~ /^[0-9]+$/ { print "ours_z" z, $1, $10 }'
    done
    if [ $have_mpi = 1 ]; then
      "$run_peer" "$build" mpi 2 256 4K 2>/dev/null | awk '$1 ~ /^[0-9]+$/ { print "ompi", $1, $2 }' || true
    fi
  done
}

for w in $worlds; do
  echo "== world $w"
  for name in mpi gloo torch; do
    : >"$out/peer_${name}_w$w.txt"
    if [[ " $peers " == *" $name "* ]]; then peer "$name" "$w" "$out/peer_${name}_w$w.txt"; fi
  done
  if [ "$w" = 2 ]; then
    latency >"$out/latency_raw_w2.txt"
    python3 - "$out/latency_raw_w2.txt" <<'PY' | tee "$out/latency_w2.txt"
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    fields = line.split()
    if len(fields) != 3 or not fields[1].isdigit():
        continue
    name, size, us = fields
    runs.setdefault((name, int(size)), []).append(float(us))
names = {"ours_z0": "ours shm, back to back", "ours_z1": "ours shm, blocking (-z 1)", "ompi": "Open MPI (blocking)"}
print(f"# all-reduce latency, 2 ranks, float32 sum, in place: median (min-max) of {max(map(len, runs.values()), default=0)} runs, us")
print("| bytes | " + " | ".join(names.values()) + " |")
print("|---|---|---|---|")
for size in sorted({s for _, s in runs}):
    cells = []
    for n in names:
        v = runs.get((n, size))
        cells.append(f"{statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f})" if v else "-")
    print(f"| {size} | " + " | ".join(cells) + " |")
PY
  fi
  # Up to 4 MiB 200 timed iterations (a few hundred microseconds of 20 are at the mercy of one
  # scheduler hiccup), 20 above; the peers likewise run the small sizes more often.
  for t in shm tcp; do
    rm -f "$out/ours_${t}_w$w".*
    : >"$out/ours_${t}_w$w.txt"
    if ((min_bytes <= split)); then
      launch "$w" -b "$min_bytes" -e "$((max_bytes < split ? max_bytes : split))" -f 4 -n "${ITERS:-200}" -w 20 -d float -o sum \
        --transport "$t" --csv "$out/ours_${t}_w$w.small.csv" -J "$out/ours_${t}_w$w.small.json" | tee -a "$out/ours_${t}_w$w.txt"
    fi
    if ((max_bytes > split)); then
      launch "$w" -b "$((min_bytes > split ? min_bytes : 4 * split))" -e "$max_bytes" -f 4 -n "${ITERS:-20}" -w 5 -d float -o sum \
        --transport "$t" --csv "$out/ours_${t}_w$w.large.csv" -J "$out/ours_${t}_w$w.large.json" | tee -a "$out/ours_${t}_w$w.txt"
    fi
    # One CSV: the first part's header and rows, then the other's rows.
    header=1
    for part in small large; do
      [ -f "$out/ours_${t}_w$w.$part.csv" ] || continue
      tail -n +$((header ? 1 : 2)) "$out/ours_${t}_w$w.$part.csv" >>"$out/ours_${t}_w$w.csv"
      header=0
    done
  done
  python3 - "$out" "$w" <<'PY' | tee "$out/summary_w$w.txt"
import csv, os, re, sys
out, world = sys.argv[1], int(sys.argv[2])
def ours(t):
    path = f"{out}/ours_{t}_w{world}.csv"
    if not os.path.exists(path): return {}
    return {int(r["bytes"]): (float(r["ip_time_us"]), float(r["ip_busbw"])) for r in csv.DictReader(open(path))}
def peer(name):
    """bench/peers/run_local.sh's rows: bytes time_us algbw busbw."""
    path = f"{out}/peer_{name}_w{world}.txt"
    if not os.path.exists(path): return {}
    rows = (line.split() for line in open(path) if not line.startswith("#"))
    return {int(f[0]): (float(f[1]), float(f[3])) for f in rows if len(f) == 4 and f[0].isdigit()}
lines = {"shm": ours("shm"), "tcp": ours("tcp"), "ompi": peer("mpi"), "gloo": peer("gloo"), "torch": peer("torch")}
names = ["shm", "tcp", "ompi", "gloo", "torch"]
labels = {"shm": "ours shm", "tcp": "ours tcp", "ompi": "Open MPI", "gloo": "Gloo", "torch": "PyTorch gloo"}
sizes = sorted(set().union(*[set(v) for v in lines.values()]))
def cell(name, size, latency):
    v = lines.get(name, {}).get(size)
    if v is None: return "-"
    return f"{v[0]:.1f} us" if latency else f"{v[1]:.3f}"
def ratio(a, b, size, latency):
    x, y = lines.get(a, {}).get(size), lines.get(b, {}).get(size)
    if not x or not y: return "-"
    return f"{y[0] / x[0]:.2f}x" if latency else (f"{x[1] / y[1]:.2f}x" if y[1] > 0 else "-")
print(f"# all-reduce, float32 sum, in place, world {world}: busbw GB/s (time for <= 4 KiB); ratios > 1 mean ours is better")
head = ["bytes"] + [labels[n] for n in names] + ["shm/OMPI", "tcp/Gloo", "tcp/torch"]
print("| " + " | ".join(head) + " |")
print("|" + "---|" * len(head))
for s in sizes:
    lat = s <= 4096
    row = [str(s)] + [cell(n, s, lat) for n in names] + [ratio("shm", "ompi", s, lat), ratio("tcp", "gloo", s, lat), ratio("tcp", "torch", s, lat)]
    print("| " + " | ".join(row) + " |")
with open(f"{out}/plot_w{world}.dat", "w") as dat:
    dat.write("# bytes " + " ".join(names) + "\n")
    for s in sizes:
        dat.write(f"{s} " + " ".join(f"{lines[n][s][1]:.4f}" if s in lines.get(n, {}) else "NaN" for n in names) + "\n")
# Large tcp all-reduces against the host's own loopback figures of this run (limits.txt).
limits = open(f"{out}/limits.txt").read() if os.path.exists(f"{out}/limits.txt") else ""
stream = re.search(r"tcp one stream\s+([\d.]+) GB/s", limits)
moved = re.search(r"two streams,\s+64 MiB bufs\s+([\d.]+)", limits)
big = [s for s in sizes if s >= 16 << 20 and s in lines["tcp"]]
if world == 2 and big and (stream or moved):
    print()
    print("# ours tcp from 16 MiB against this run's loopback figures (bench/tcp_limits): one stream, and two")
    print("# streams in opposite directions through 64 MiB buffers with no reduction (bench/tcp_limits)")
    print("| bytes | ours tcp | / one stream | / two streams, 64 MiB bufs |")
    print("|---|---|---|---|")
    for s in big:
        b = lines["tcp"][s][1]
        cells = [f"{b / float(m.group(1)):.2f}x" if m else "-" for m in (stream, moved)]
        print(f"| {s} | {b:.3f} | " + " | ".join(cells) + " |")
PY
  if command -v gnuplot >/dev/null; then
    # (a peer that did not run leaves its column empty, which gnuplot warns about: not worth a line)
    gnuplot -e "datafile='$out/plot_w$w.dat'; outfile='$out/allreduce_busbw_w$w.svg'; world=$w" "$top/bench/plot_allreduce.gp" \
      2> >(grep -v "Skipping data file with no valid points" >&2)
    echo "plot: $out/allreduce_busbw_w$w.svg"
  else
    echo "(gnuplot not installed: no plot; scripts/deps.sh gnuplot-nox installs it)"
  fi
done
