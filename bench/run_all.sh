#!/usr/bin/env bash
# make bench: every benchmark of the project, each beside its peers from ../shared/anchors/run.sh in the
# same command (these machines are shared and noisy: only figures taken side by side are compared).
#
# On a fresh machine each step first installs what it needs (PyTorch for the training anchor, gnuplot for
# the plots; the anchors install Open MPI and Gloo themselves), or, when it cannot, says in one line what it
# skips and goes on. A peer that fails is reported as failed, never as a figure. The exit status is that of
# the project's own benchmarks: a failing peer does not fail `make bench`.
# usage: bench/run_all.sh [BUILD_DIR]          (TINYDDP_ANCHORS=path/to/run.sh, or none: without peers)
set -uo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$top/build}" && pwd)
anchors=${TINYDDP_ANCHORS:-$top/../shared/anchors/run.sh}  # the peers; TINYDDP_ANCHORS=none runs without them
bin=$build/bin
failed=()

have_anchors() { [ -x "$anchors" ]; }
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

# PyTorch for the training anchors: installed from Debian when missing (as root), then imported once.
torch=unknown
torch_ready() {
  if [ $torch = unknown ]; then
    torch=no
    if have_anchors && [ -f "$(dirname "$anchors")/torch_ddp_train.py" ]; then
      "$top/scripts/deps.sh" python3-torch >/dev/null 2>&1
      /usr/bin/python3 -c 'import torch' >/dev/null 2>&1 && torch=yes
    fi
  fi
  [ $torch = yes ]
}

echo "== physical limits of this host"
if have_anchors; then peer "limits" "$anchors" limits; else skip "no peers: $anchors not found (TINYDDP_ANCHORS names the anchors' run.sh)"; fi

echo; echo "== training step: tinyddp one process (against its GEMM-only bound), then 2 data-parallel ranks"
if torch_ready; then
  echo "   beside PyTorch DDP on 2 ranks; then PyTorch in one process"
  ours train_bench "$bin/train_bench" --world-size 2 --torch-anchor "$(dirname "$anchors")/torch_ddp_train.py"
  peer "PyTorch one process" /usr/bin/python3 "$(dirname "$anchors")/torch_ddp_train.py" 1 784 1024 10 16384 256 2
else
  have_anchors && skip "PyTorch (python3-torch) could not be installed and imported, or torch_ddp_train.py is missing: the PyTorch anchors"
  ours train_bench "$bin/train_bench" --world-size 2
fi

echo; echo "== the seed job, whole process: tinyddp vs PyTorch"
seed_job() { /usr/bin/time -f "tinyddp dummy: %e s wall, %M KiB peak RSS" "$bin/dummy" --save "" >/dev/null; }
ours dummy seed_job
if torch_ready; then
  peer "PyTorch seed job" /usr/bin/time -f "PyTorch seed job: %e s wall, %M KiB peak RSS (parent process)" \
    /usr/bin/python3 "$(dirname "$anchors")/torch_ddp_train.py" 1 10 0 2 1000 32 10
fi

echo; echo "== store"
ours store_bench "$bin/store_bench"

echo; echo "== all-reduce, beside Open MPI, Gloo and PyTorch"
"$top/scripts/deps.sh" gnuplot-nox >/dev/null 2>&1 || skip "gnuplot-nox could not be installed: no plots"
ours compare_allreduce "$top/bench/compare_allreduce.sh" "$build"

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
