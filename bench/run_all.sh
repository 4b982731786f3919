#!/usr/bin/env bash
# make bench: every benchmark of the project, each beside its peers (bench/peers/: Open MPI, Gloo and
# PyTorch, written in this tree) in the same command (these machines are shared and noisy: only figures
# taken side by side are compared).
#
# `make bench` first installs the peers from Debian (scripts/deps.sh --bench) and builds their programs
# where their libraries were found. A peer that is missing is skipped, saying so in one line; a peer
# that fails is reported as failed, never as a figure. The exit status is that of the project's own
# benchmarks: a missing or failing peer does not fail `make bench`.
# usage: bench/run_all.sh [BUILD_DIR]          (PEERS="mpi gloo torch" by default; PEERS="": ours alone)
set -uo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$top/build}" && pwd)
export PEERS=${PEERS-mpi gloo torch}
bin=$build/bin
peers=$top/bench/peers
torch_train=$peers/torch_train.py  # PyTorch (DDP) on train_bench's job: --world --in --hidden --out --samples --batch --epochs
failed=()

skip() { echo "(skipped: $*)"; }

# Runs one of our own steps, named by its first argument; a failure is noted and the next step runs.
ours() {
  local name=$1
  shift
  "$@"
  local status=$?
  [ $status -eq 0 ] || { echo "(FAILED with status $status: $*)"; failed+=("$name"); }
}

# Runs a peer; its output is shown only when it succeeded, so an error never reads as a figure.
peer() {
  local what=$1 output status
  shift
  output=$("$@" 2>&1)
  status=$?
  if [ $status -eq 0 ]; then printf '%s\n' "$output"; else echo "(peer $what failed with status $status: no figure; its last lines:)"; printf '%s\n' "$output" | tail -n 3 | sed 's/^/    /'; fi
}

# The PyTorch training peer runs when PEERS names torch, bench/peers/torch_train.py is in the tree and
# /usr/bin/python3 imports torch (python3-torch); otherwise one line says which is missing.
torch_why=""
if [[ " $PEERS " != *" torch "* ]]; then torch_why="PEERS does not name torch"
elif [ ! -f "$torch_train" ]; then torch_why="this tree has no bench/peers/torch_train.py"
elif ! /usr/bin/python3 -c 'import torch.distributed' >/dev/null 2>&1; then torch_why="/usr/bin/python3 does not import torch (python3-torch)"
fi
torch_ready() { [ -z "$torch_why" ]; }

echo "== physical limits of this host: one core's memory bandwidth, loopback TCP"
if [ -x "$bin/memory_limits" ]; then ours memory_limits "$bin/memory_limits" -b 64M -e 64M
else skip "memory_limits: bench/peers/memory_limits.cpp is not in this tree"; fi
ours tcp_limits "$bin/tcp_limits" --gib 1

echo; echo "== training step: tinyddp one process (against its GEMM-only bound), then 2 data-parallel ranks"
if torch_ready; then
  echo "   beside PyTorch DDP on 2 ranks; then PyTorch in one process"
  ours train_bench "$bin/train_bench" --world-size 2 --torch-anchor "$torch_train"
  peer "PyTorch one process" /usr/bin/python3 "$torch_train" --world 1 --in 784 --hidden 1024 --out 10 --samples 16384 \
    --batch 256 --epochs 2
else
  skip "the PyTorch peer: $torch_why"
  ours train_bench "$bin/train_bench" --world-size 2
fi

echo; echo "== the seed job, whole process: tinyddp vs PyTorch"
seed_job() { /usr/bin/time -f "tinyddp dummy: %e s wall, %M KiB peak RSS" "$bin/dummy" --save "" >/dev/null; }
ours dummy seed_job
if torch_ready; then
  peer "PyTorch seed job" /usr/bin/time -f "PyTorch seed job: %e s wall, %M KiB peak RSS (parent process)" \
    /usr/bin/python3 "$torch_train" --world 1 --in 10 --hidden 0 --out 2 --samples 1000 --batch 32 --epochs 10
fi

echo; echo "== store"
ours store_bench "$bin/store_bench"

echo; echo "== all-reduce, beside Open MPI, Gloo and PyTorch"
ours compare_allreduce "$top/bench/compare_allreduce.sh" "$build"

echo; echo "== DDP against ZeRO-1, beside PyTorch's ZeroRedundancyOptimizer (2 pairs of runs)"
ours compare_zero "$top/bench/compare_zero.sh" "$build" 2

echo; echo "== the other collectives, 2 ranks, shm and tcp (nccl-tests' JSON in $build/bench-collectives/)"
mkdir -p "$build/bench-collectives"
for program in all_gather_perf reduce_scatter_perf broadcast_perf; do
  for transport in shm tcp; do
    json=$build/bench-collectives/${program}_${transport}_w2.json
    rm -f "$json"
    ours "$program" "$bin/tinyddp-run" -n 2 "$bin/$program" -b 1K -e 64M -f 8 -n 20 -w 5 --transport "$transport" -J "$json"
  done
done

if [ ${#failed[@]} -gt 0 ]; then
  echo; echo "make bench: ${#failed[@]} of the project's own benchmarks failed: ${failed[*]}"
  exit 1
fi
