#!/usr/bin/env bash
# Plain DDP against ZeRO-1 (nn/optim/zero_redundancy_optimizer.h), the same job side by side,
# alternating runs (these hosts are shared and noisy: only figures taken together are compared):
#   - train_bench's data-parallel part under tinyddp-run (an MLP IN-H-H-10, Adam, batch 256 per rank),
#     and beside it PyTorch's DDP (gloo, CPU, one thread per process) with torch.optim.Adam and with
#     torch.distributed.optim.ZeroRedundancyOptimizer(Adam) on the same job (bench/peers/torch_zero_train.py):
#     the seconds rank 0 trained, the last epoch's loss, the peak resident memory of the largest
#     process (GNU time's %M over the launcher: its largest worker) and the optimizer state bytes of
#     each rank (ours: rank 0's);
#   - examples/digits with the same worker count: wall seconds and test accuracy.
# Then the median time of each and the ratios ZeRO-1 / DDP on each side. PyTorch runs where
# /usr/bin/python3 (or TORCH_PYTHON, or python3) imports torch, unless PEERS is set and does not name
# torch; otherwise it is skipped, saying so.
#
# usage: bench/compare_zero.sh [BUILD_DIR] [PAIRS] [RANKS] [HIDDEN]   (default: build, 4, 2, 1024)
# output: the tables on stdout; docs/results.md keeps the figures of one run and what they mean.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$top/build}" && pwd)
pairs=${2:-4}
ranks=${3:-2}
hidden=${4:-1024}
cmake --build "$build" --target train_bench digits tinyddp-run -j 2 >/dev/null
bin=$build/bin
digits_data=${TINYDDP_DIGITS:-$top/data/digits.csv.gz}  # make data extracts it

torch_python=""
if [[ " ${PEERS-torch} " != *" torch "* ]]; then
  echo "PyTorch: skipped, PEERS does not name torch"
else
  for candidate in ${TORCH_PYTHON:-} /usr/bin/python3 python3; do
    if "$candidate" -c 'import torch.distributed.optim' 2>/dev/null; then torch_python=$candidate; break; fi
  done
  [ -n "$torch_python" ] || echo "PyTorch: skipped, no python3 here imports torch (set TORCH_PYTHON to one that does)"
fi

median() { sort -g | awk '{a[NR]=$1} END {if (NR % 2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", a / b}'; }

echo "train_bench 784-$hidden-$hidden-10, $ranks ranks, batch 256 per rank, 8192 samples, 2 epochs (load: $(uptime | sed 's/.*load/load/'))"
printf '%-5s %-8s %-5s %9s %10s %14s  %s\n' pair side zero seconds last_loss peak_rss_MiB optimizer_state_bytes
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
job=(--in 784 --hidden "$hidden" --out 10 --samples 8192 --batch-size 256 --epochs 2)
for p in $(seq 1 "$pairs"); do
  for z in 0 1; do
    /usr/bin/time -f "%M" -o "$tmp/rss" "$bin/tinyddp-run" -n "$ranks" "$bin/train_bench" --world-size "$ranks" \
      "${job[@]}" --zero "$z" >"$tmp/out" 2>&1
    line=$(grep "data-parallel" "$tmp/out")
    seconds=$(echo "$line" | awk '{print $5}')
    loss=$(echo "$line" | sed -e 's/.*loss \([0-9.]*\).*/\1/')
    state=$(echo "$line" | sed -n -e 's/.*optimizer state \([0-9]*\) bytes.*/\1 (rank 0)/p')
    rss=$(awk '{printf "%.1f", $1 / 1024}' "$tmp/rss")
    printf '%-5s %-8s %-5s %9s %10s %14s  %s\n' "$p" tinyddp "$z" "$seconds" "$loss" "$rss" "$state"
    echo "$seconds" >>"$tmp/train_$z"
    [ -n "$torch_python" ] || continue
    /usr/bin/time -f "%M" -o "$tmp/rss" "$torch_python" "$top/bench/peers/torch_zero_train.py" "$ranks" 784 "$hidden" 10 \
      8192 256 2 "$z" >"$tmp/out" 2>&1 || { cat "$tmp/out" >&2; exit 1; }
    line=$(grep "^torch" "$tmp/out")
    seconds=$(echo "$line" | sed -e 's/.*train \([0-9.]*\) s.*/\1/')
    loss=$(echo "$line" | sed -e 's/.*loss \([0-9.]*\).*/\1/')
    state=$(echo "$line" | sed -e 's/.*per rank //')
    rss=$(awk '{printf "%.1f", $1 / 1024}' "$tmp/rss")
    printf '%-5s %-8s %-5s %9s %10s %14s  %s\n' "$p" pytorch "$z" "$seconds" "$loss" "$rss" "$state"
    echo "$seconds" >>"$tmp/torch_$z"
  done
done
t0=$(median <"$tmp/train_0"); t1=$(median <"$tmp/train_1")
echo "median seconds: tinyddp DDP $t0, ZeRO-1 $t1, ZeRO-1 / DDP = $(ratio "$t1" "$t0")"
if [ -n "$torch_python" ]; then
  p0=$(median <"$tmp/torch_0"); p1=$(median <"$tmp/torch_1")
  echo "median seconds: PyTorch DDP $p0, ZeroRedundancyOptimizer $p1, ZeRO / DDP = $(ratio "$p1" "$p0")"
  echo "tinyddp / PyTorch: DDP $(ratio "$t0" "$p0"), ZeRO-1 $(ratio "$t1" "$p1")"
fi

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
  echo "median seconds: DDP $d0, ZeRO-1 $d1, ZeRO-1 / DDP = $(ratio "$d1" "$d0")"
else
  echo "digits: skipped, no digits.csv.gz (make data extracts it, or set TINYDDP_DIGITS)"
fi
