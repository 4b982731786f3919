#!/usr/bin/env bash
# Plain DDP against ZeRO-1 (nn/optim/zero_redundancy_optimizer.h), the same job side by side,
# alternating runs (these hosts are shared and noisy: only figures taken together are compared):
#   - train_bench's data-parallel part under tinyddp-run (an MLP IN-H-H-10, Adam, batch 256 per rank):
#     the seconds rank 0 trained, its last epoch loss (equal on both sides when the weights are), and
#     the peak resident memory of the largest process (GNU time's %M over tinyddp-run: its largest
#     worker);
#   - examples/digits with the same worker count: wall seconds and test accuracy.
# Then the median time of each side and the ratio ZeRO-1 / DDP. PyTorch's ZeroRedundancyOptimizer
# runs beside them only where python3 has torch (it is not installed on the development hosts).
#
# usage: bench/compare_zero.sh [BUILD_DIR] [PAIRS] [RANKS] [HIDDEN]   (default: build, 4, 2, 1024)
# output: the tables on stdout; bench/zero_results.md keeps the figures of one run and what they mean.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$top/build}" && pwd)
pairs=${2:-4}
ranks=${3:-2}
hidden=${4:-1024}
cmake --build "$build" --target train_bench digits tinyddp-run -j 2 >/dev/null
bin=$build/bin
digits_data=${TINYDDP_DIGITS:-$top/../shared/data/digits.csv.gz}
[ -f "$digits_data" ] || digits_data=$top/data/digits.csv.gz

median() { sort -g | awk '{a[NR]=$1} END {if (NR % 2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

echo "train_bench 784-$hidden-$hidden-10, $ranks ranks, batch 256 per rank, 8192 samples, 2 epochs"
printf '%-5s %-5s %9s %12s %14s\n' pair zero seconds last_loss peak_rss_MiB
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for p in $(seq 1 "$pairs"); do
  for z in 0 1; do
    /usr/bin/time -f "%M" -o "$tmp/rss" "$bin/tinyddp-run" -n "$ranks" "$bin/train_bench" --world-size "$ranks" \
      --in 784 --hidden "$hidden" --out 10 --samples 8192 --batch-size 256 --epochs 2 --zero "$z" >"$tmp/out" 2>&1
    line=$(grep "data-parallel" "$tmp/out")
    seconds=$(echo "$line" | awk '{print $5}')
    loss=$(echo "$line" | sed -e 's/.*loss \([0-9.]*\).*/\1/')
    rss=$(awk '{printf "%.1f", $1 / 1024}' "$tmp/rss")
    printf '%-5s %-5s %9s %12s %14s\n' "$p" "$z" "$seconds" "$loss" "$rss"
    echo "$seconds" >>"$tmp/train_$z"
  done
done
t0=$(median <"$tmp/train_0"); t1=$(median <"$tmp/train_1")
echo "median seconds: DDP $t0, ZeRO-1 $t1, ZeRO-1 / DDP = $(awk -v a="$t1" -v b="$t0" 'BEGIN {printf "%.3f", a / b}')"

if [ -f "$digits_data" ]; then
  echo
  echo "digits (64-128-10, 50 epochs), $ranks workers"
  printf '%-5s %-5s %9s %10s\n' pair zero seconds accuracy
  for p in $(seq 1 "$pairs"); do
    for z in 0 1; do
      start=$(date +%s.%N)
      accuracy=$("$bin/digits" --data "$digits_data" --device cpu --world-size "$ranks" --zero "$z" 2>&1 |
                 sed -n -e 's/.*test accuracy \([0-9.]*\).*/\1/p')
      seconds=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN {printf "%.2f", e - s}')
      printf '%-5s %-5s %9s %10s\n' "$p" "$z" "$seconds" "$accuracy"
      echo "$seconds" >>"$tmp/digits_$z"
    done
  done
  d0=$(median <"$tmp/digits_0"); d1=$(median <"$tmp/digits_1")
  echo "median seconds: DDP $d0, ZeRO-1 $d1, ZeRO-1 / DDP = $(awk -v a="$d1" -v b="$d0" 'BEGIN {printf "%.3f", a / b}')"
else
  echo "digits: skipped, no digits.csv.gz (make data extracts it, or set TINYDDP_DIGITS)"
fi

if python3 -c 'import torch' 2>/dev/null; then
  echo "PyTorch is installed: its ZeroRedundancyOptimizer comparison is not scripted yet"
else
  echo "PyTorch's ZeroRedundancyOptimizer: skipped, python3 has no torch"
fi
