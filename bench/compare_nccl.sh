#!/usr/bin/env bash
# tinyddp's all-reduce over NCCL beside nccl-tests' all_reduce_perf, on the same GPUs and the same NCCL:
#   ours        tinyddp-run -n GPUS all_reduce_perf --backend nccl   (one process per GPU)
#   nccl-tests  all_reduce_perf -g GPUS                              (one process driving every GPU)
# in turns, three rounds, the median of the three per size; the calls launched back to back (-z 0), then
# each awaited before the next (-z 1; nccl-tests' -z 1 also runs a barrier after each, ours does not).
# Out of place, float32 sum. Figures: time in microseconds a call; ratio = nccl-tests' time / ours
# (above 1: ours is faster). With one GPU NCCL's all-reduce is a device copy, so the small sizes show
# the host's cost of a call (docs/gpu.md, docs/results.md).
#
# usage: bench/compare_nccl.sh NCCL_TESTS_ALL_REDUCE_PERF [GPUS]
#   NCCL_TESTS_ALL_REDUCE_PERF  nccl-tests' all_reduce_perf, built against the NCCL this machine loads:
#                               git clone https://github.com/NVIDIA/nccl-tests
#                               make -C nccl-tests src.build NCCL_HOME=<NCCL's prefix> CUDA_HOME=<CUDA's>
#   GPUS                        how many GPUs (default: every one nvidia-smi lists)
# Both programs must load the same libnccl.so.2: nccl-tests takes the loader's, and ours looks on
# LD_LIBRARY_PATH first (docs/gpu.md, "Finding NCCL"); TINYDDP_NCCL_LIBRARY names one file for ours.
# tinyddp's programs: the bin/ beside this script in the GPU bundle (make gpu-bundle), else build/bin;
# TINYDDP_BIN names another folder. TINYDDP_BENCH_QUICK=1: small sizes, one round (a check that the
# script works). Output: the summary, also written to OUT_DIR (default ./bench-nccl) with the raw rows.
set -euo pipefail

usage="usage: bench/compare_nccl.sh NCCL_TESTS_ALL_REDUCE_PERF [GPUS]"
[ $# -ge 1 ] || { echo "$usage" >&2; exit 2; }
peer=$1
if [ ! -f "$peer" ] || [ ! -x "$peer" ]; then
  echo "compare_nccl: $peer is not an executable file; give the path of nccl-tests' all_reduce_perf ($usage)" >&2
  exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
if [ -n "${TINYDDP_BIN:-}" ]; then
  bin=$TINYDDP_BIN
elif [ -x "$here/bin/all_reduce_perf" ]; then
  bin=$here/bin  # inside the GPU bundle: its libraries and CUDA modules too, as run_checks.sh does
  export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" TINYDDP_PLUGIN_DIR="$here/lib"
else
  bin=$here/../build/bin
fi
for program in tinyddp-run all_reduce_perf; do
  [ -x "$bin/$program" ] || { echo "compare_nccl: no $program in $bin (make all_reduce_perf tinyddp-run, or set TINYDDP_BIN)" >&2; exit 2; }
done
if [ $# -ge 2 ]; then
  gpus=$2
  [[ $gpus =~ ^[1-9][0-9]*$ ]] || { echo "compare_nccl: GPUS must be a whole number from 1, not '$gpus' ($usage)" >&2; exit 2; }
else
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  [ "$gpus" -gt 0 ] || { echo "compare_nccl: nvidia-smi lists no GPU here; this comparison needs NCCL on GPUs (or give GPUS)" >&2; exit 2; }
fi
out=${OUT_DIR:-bench-nccl}
mkdir -p "$out"

sweeps=("-b 8 -e 2M -f 8 -n 500 -w 50" "-b 16M -e 1G -f 8 -n 20 -w 5")
rounds=3
if [ -n "${TINYDDP_BENCH_QUICK:-}" ]; then
  sweeps=("-b 8 -e 4K -f 8 -n 5 -w 1")
  rounds=1
fi

# Both print nccl-tests' table (ours with "[rank 0] " before each line): size count type redop root,
# then out of place time algbw busbw #wrong, then in place. Rows: "bytes time_us", or "WRONG bytes".
rows() { sed -e 's/^\[rank [0-9]*\] //' | awk '$1 ~ /^[0-9]+$/ && NF >= 9 { if ($9 != 0) print "WRONG", $1; print $1, $6 }'; }
run() {  # WHO Z SWEEP
  local who=$1 z=$2 sweep=$3
  # shellcheck disable=SC2086
  case $who in
    ours) "$bin/tinyddp-run" -n "$gpus" -- "$bin/all_reduce_perf" --backend nccl $sweep -c 1 -z "$z" ;;
    nccl-tests) "$peer" $sweep -g "$gpus" -c 1 -z "$z" | tee -a "$out/peer_output.txt" ;;
  esac
}

: >"$out/raw.txt"
: >"$out/peer_output.txt"
for round in $(seq 1 "$rounds"); do
  for z in 0 1; do
    for sweep in "${sweeps[@]}"; do
      # The order turns every round, so neither program always runs right after the other.
      order="ours nccl-tests"
      [ $((round % 2)) -eq 0 ] && order="nccl-tests ours"
      for who in $order; do
        run "$who" "$z" "$sweep" | rows | sed "s/^/$who $z /" >>"$out/raw.txt"
      done
    done
  done
done

gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
nccl=$(sed -n 's/.*nccl-library=\([0-9]*\).*/\1/p' "$out/peer_output.txt" | head -1)
python3 - "$out/raw.txt" "$gpus" "${gpu_name:-GPU}" "${nccl:-}" "$rounds" <<'EOF' | tee "$out/summary.txt"
import statistics, sys
raw, gpus, gpu_name, nccl, rounds = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
times, wrong = {}, []
for line in open(raw):
    f = line.split()
    if f[2] == "WRONG":
        wrong.append(f"{f[0]} -z {f[1]}: {f[3]} bytes")
        continue
    times.setdefault((f[0], f[1], int(f[2])), []).append(float(f[3]))
if nccl:  # NCCL_VERSION_CODE: major * 10000 + minor * 100 + patch
    code = int(nccl)
    nccl = f"NCCL {code // 10000}.{code % 10000 // 100}.{code % 100}"
print(f"# all-reduce over NCCL, {gpus} x {gpu_name}, out of place, float32 sum; {nccl or 'NCCL'}; "
      f"median of {rounds} round(s) in turns")
print("# us a call; ratio = nccl-tests' time / ours (above 1: ours is faster)")
print(f"{'bytes':>11} | {'-z 0: ours':>11} {'nccl-tests':>11} {'ratio':>6} | {'-z 1: ours':>11} {'nccl-tests':>11} {'ratio':>6}")
for size in sorted({s for (_, _, s) in times}):
    cells = []
    for z in ("0", "1"):
        ours, peer = times.get(("ours", z, size)), times.get(("nccl-tests", z, size))
        o = statistics.median(ours) if ours else None
        p = statistics.median(peer) if peer else None
        show = lambda t: f"{t:>11.2f}" if t is not None else f"{'-':>11}"
        cells.append(f"{show(o)} {show(p)} " + (f"{p / o:>5.2f}x" if o and p else f"{'-':>6}"))
    print(f"{size:>11} | " + " | ".join(cells))
for w in wrong:
    print(f"WRONG RESULTS: {w}")
EOF
! grep -q '^WRONG' "$out/summary.txt" 2>/dev/null
