#!/usr/bin/env bash
# All-reduce inside one host: ours on ordinary buffers (-R 0) by each of the three ways an ordinary
# tensor can go (comm/tuning.h chooses one): the shared-memory FIFOs (TINYDDP_STAGING=0
# TINYDDP_CROSS_MEMORY=0), staged through symmetric memory (TINYDDP_STAGING=1) and through the
# kernel, process_vm_readv/writev (TINYDDP_CROSS_MEMORY=1); ours on symmetric buffers (-R 2:
# ProcessGroup::allocate_symmetric); ours as comm/tuning.h chooses (auto); and Open MPI
# (bench/peers/mpi_all_reduce), as it comes and with glibc's malloc advising huge pages (as tinyddp's
# allocator does from 2 MiB: Open MPI at its best), run interleaved in one
# command, three rounds, the median of the three per size, with ratios; beside them one core's memcpy
# and a += b rates (bench/peers/memory_limits) and the bound they set for the bytes the symmetric
# all-reduce moves (each rank reduces (n-1)/n of the buffer as a += b and copies (n-1)/n of it: busbw
# bound = 2 / (1/R_add + 1/R_copy), whatever n is, while every rank has a core); for 2 ranks also the
# same bytes moved by two bare threads on two cores (memory_limits' "2 cores": the lines that cross
# between the cores, which one core's rates do not count, with no runtime around them). Up to 32 KiB every
# column but Open MPI's is the slots' one-barrier all-reduce (algorithms/slot_all_reduce.h).
#
# Every row: in place, float32 sum, blocking (each call awaited before the next, as MPI_Allreduce is),
# time in microseconds and busbw = algbw * 2(n-1)/n in GB/s. Ratios: ours / Open MPI busbw (above 1:
# ours is faster), ours / the bound.
#
# usage: bench/compare_symmetric.sh [BUILD_DIR] [WORLD ...]      (default: build, world 2)
#        TINYDDP_BENCH_QUICK=1 runs three small sizes only (a check that the script works)
#        TINYDDP_BENCH_RT=1 runs every program (ours and Open MPI alike) under `chrt -f 1` (needs root):
#        on a host shared with builds, so that they do not decide the figures; say so beside them
#        TINYDDP_BENCH_REWRITE=1 has every program (ours and Open MPI alike) write its input before each
#        call, the writes' time left out (--rewrite 1), as a backward pass writes a DDP bucket: the
#        input's lines are then the writer's, not where the previous call left them
#        TINYDDP_BIN=DIR takes tinyddp-run, all_reduce_perf, memory_limits and mpi_all_reduce from DIR,
#        built elsewhere, and builds nothing (a node without the build's tools); BUILD_DIR still holds
#        the output
# output: BUILD_DIR/bench-symmetric/ (raw tables, summary_w<N>.txt)
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$top/build}" && pwd)
shift || true
worlds=${*:-2}
out=$build/bench-symmetric
mkdir -p "$out"
bin=$build/bin
if [ -n "${TINYDDP_BIN:-}" ]; then
  # programs built elsewhere, on a machine that cannot build them
  [ -d "$TINYDDP_BIN" ] || { echo "compare_symmetric: TINYDDP_BIN=$TINYDDP_BIN is not a folder; give the bin/ of a build (or of the GPU bundle)" >&2; exit 2; }
  bin=$(cd "$TINYDDP_BIN" && pwd)
  build_hint="copy it into $bin from a build that has it"
else
  cmake --build "$build" --target tinyddp-run all_reduce_perf memory_limits -j "$(nproc)" >/dev/null
  cmake --build "$build" --target mpi_all_reduce -j "$(nproc)" >/dev/null 2>&1 || true
  build_hint="build it: cmake --build $build --target <it>"
fi
for program in tinyddp-run all_reduce_perf memory_limits; do
  [ -x "$bin/$program" ] || { echo "compare_symmetric: no $program in $bin; $build_hint" >&2; exit 2; }
done
perf=$bin/all_reduce_perf
mpi=$bin/mpi_all_reduce
if [ ! -x "$mpi" ]; then
  if [ -n "${TINYDDP_BIN:-}" ]; then
    echo "(no mpi_all_reduce in $bin: $build_hint; ours alone)"
  else
    echo "(Open MPI's program is not built: install libopenmpi-dev openmpi-bin and rebuild; ours alone)"
  fi
fi

# Four sweeps per program, each with enough iterations that one scheduler hiccup (tens of
# microseconds) does not decide a row: the small sizes (a few microseconds a call), 64 KiB - 1 MiB
# (a few to a hundred), 4 - 16 MiB, and the largest.
sweeps=("-b 1K -e 16K -n 1000 -w 50" "-b 64K -e 1M -n 200 -w 20" "-b 4M -e 16M -n 20 -w 5" "-b 64M -e 256M -n 5 -w 2")
rt=()
[ -z "${TINYDDP_BENCH_RT:-}" ] || rt=(chrt -f 1)
rewrite=()
[ -z "${TINYDDP_BENCH_REWRITE:-}" ] || rewrite=(--rewrite 1)
[ -z "${TINYDDP_BENCH_QUICK:-}" ] || sweeps=("-b 1K -e 256K -n 5 -w 1")  # a check that the script runs

ours() {  # WORLD REGISTRATION CROSS_MEMORY STAGING SWEEP: rows "bytes time_us" (in-place columns)
  local n=$1 reg=$2 cma=$3 staging=$4 sweep=$5 choose=()
  # "auto": neither switch set, the choice comm/tuning.h makes
  [ "$cma" = auto ] || choose=(TINYDDP_CROSS_MEMORY="$cma" TINYDDP_STAGING="$staging")
  # shellcheck disable=SC2086
  env "${choose[@]}" "${rt[@]}" "$bin/tinyddp-run" -n "$n" "$perf" $sweep -f 4 -d float -o sum -c 1 -z 1 -R "$reg" --transport shm "${rewrite[@]}" |
    sed -e 's/^\[rank [0-9]*\] //' | awk '$1 ~ /^[0-9]+$/ { if ($13 != 0) print "WRONG", $1; print $1, $10 }'
}
peer() {  # WORLD SWEEP [GLIBC_TUNABLES]
  local n=$1 sweep=$2 tunables=${3:-}
  [ -x "$mpi" ] || return 0
  # shellcheck disable=SC2086
  env ${tunables:+GLIBC_TUNABLES=$tunables} "${rt[@]}" mpirun --allow-run-as-root --oversubscribe -np "$n" "$mpi" $sweep -f 4 "${rewrite[@]}" 2>/dev/null |
    awk '$1 ~ /^[0-9]+$/ { if ($5 != 0) print "WRONG", $1; print $1, $2 }'
}

cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
"${rt[@]}" "$bin/memory_limits" -b 64K -e 256M | tee "$out/limits.txt"
for n in $worlds; do
  : >"$out/raw_w$n.txt"
  for round in 1 2 3; do
    for sweep in "${sweeps[@]}"; do
      # The order turns every round, so no program always runs right after another.
      case $round in
        1) order="fifo staged cma auto r2 mpi mpihp" ;;
        2) order="r2 mpihp mpi fifo auto staged cma" ;;
        3) order="mpi cma auto r2 mpihp staged fifo" ;;
      esac
      for who in $order; do
        load=$(cut -d' ' -f1 /proc/loadavg)
        case $who in
          fifo) ours "$n" 0 0 0 "$sweep" | sed "s/^/fifo $load /" ;;
          staged) ours "$n" 0 0 1 "$sweep" | sed "s/^/staged $load /" ;;
          cma) ours "$n" 0 1 0 "$sweep" | sed "s/^/cma $load /" ;;
          auto) ours "$n" 0 auto auto "$sweep" | sed "s/^/auto $load /" ;;
          r2) ours "$n" 2 0 0 "$sweep" | sed "s/^/r2 $load /" ;;
          mpi) peer "$n" "$sweep" | sed "s/^/mpi $load /" ;;
          mpihp) peer "$n" "$sweep" glibc.malloc.hugetlb=1 | sed "s/^/mpihp $load /" ;;
        esac >>"$out/raw_w$n.txt"
      done
    done
  done
  python3 - "$out/raw_w$n.txt" "$out/limits.txt" "$n" "$cpu" "${TINYDDP_BENCH_RT:-}" "${TINYDDP_BENCH_REWRITE:-}" <<'EOF' | tee "$out/summary_w$n.txt"
import os, statistics, sys
raw, limits, n, cpu = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
rt = "; every program under chrt -f 1" if sys.argv[5] else ""
rt += "; inputs rewritten before each call (--rewrite 1)" if sys.argv[6] else ""
times, loads, wrong = {}, [], []
for line in open(raw):
    f = line.split()
    if f[2] == "WRONG":
        wrong.append(f"{f[0]} {f[3]}")
        continue
    who, load, size, t = f[0], float(f[1]), int(f[2]), float(f[3])
    times.setdefault((who, size), []).append(t)
    loads.append(load)
rates = {}
for line in open(limits):
    f = line.split()
    if f and f[0].isdigit():
        rates[int(f[0])] = (float(f[1]), float(f[2]), float(f[3]) if len(f) > 3 and f[3] != "-" else 0.0)
factor = 2 * (n - 1) / n
cores = len(os.sched_getaffinity(0))
def busbw(size, t): return size / (t * 1e-6) / 1e9 * factor
print(f"# all-reduce, {n} ranks on one host, in place, float sum, blocking; {cpu}; "
      f"load {min(loads):.2f}-{max(loads):.2f} during the runs; medians of 3 interleaved rounds{rt}")
print("# busbw GB/s (time in us up to 16 KiB); ratios: ours / the faster Open MPI column, ours / bound")
print("# fifo, staged, cma: ours on ordinary buffers (-R 0) over the fifos, staged through symmetric memory, and")
print("# through the kernel (process_vm_readv/writev); auto: ours on ordinary buffers as comm/tuning.h chooses; -R 2: ours on")
print("# symmetric buffers; MPI hp: Open MPI with glibc's malloc advising huge pages (GLIBC_TUNABLES=")
print("# glibc.malloc.hugetlb=1), as tinyddp's allocator does for blocks of 2 MiB and more")
ways = ("fifo", "staged", "cma", "auto", "r2")
print(f"{'bytes':>11} {'fifo':>10} {'staged':>10} {'cma':>10} {'auto':>10} {'-R 2':>10} {'Open MPI':>10} {'MPI hp':>10} "
      f"{'fifo/MPI':>8} {'stg/MPI':>8} {'cma/MPI':>8} {'auto/MPI':>8} {'R2/MPI':>7} {'memcpy':>7} {'a+=b':>7} "
      f"{'bound':>7} {'R2/bound':>8}" + (f" {'2 cores':>7} {'R2/2c':>6}" if n == 2 else ""))
sizes = sorted({s for (_, s) in times})
for size in sizes:
    med = {w: statistics.median(times[(w, size)]) for w in ways + ("mpi", "mpihp") if (w, size) in times}
    best_mpi = min((med[w] for w in ("mpi", "mpihp") if w in med), default=None)
    small = size <= 16384
    def show(w):
        if w not in med: return f"{'-':>10}"
        return f"{med[w]:>8.2f}us" if small else f"{busbw(size, med[w]):>10.2f}"
    def ratio(w, width=8):
        return f"{best_mpi / med[w]:>{width - 1}.2f}x" if w in med and best_mpi else f"{'-':>{width}}"
    row = (f"{size:>11} " + " ".join(show(w) for w in ways + ("mpi", "mpihp")) + " " +
           " ".join(ratio(w, 7 if w == "r2" else 8) for w in ways))
    if size in rates and not small:
        copy, add, pair = rates[size]
        bound = 2 / (1 / add + 1 / copy)
        # The bound holds while every rank has a core of its own; with more ranks than cores, the ranks
        # take turns on the cores and no rate of one core bounds them.
        r2 = f"{busbw(size, med['r2']) / bound:>8.0%}" if "r2" in med and n <= cores else f"{'-':>8}"
        row += f" {copy:>7.2f} {add:>7.2f} {bound:>7.2f} {r2}"
        if n == 2 and pair > 0:
            row += f" {pair:>7.2f} " + (f"{busbw(size, med['r2']) / pair:>6.0%}" if "r2" in med else f"{'-':>6}")
    print(row)
for w in wrong:
    print("WRONG RESULTS:", w)
EOF
done
