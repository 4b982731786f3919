#!/usr/bin/env bash
# make bench: every benchmark of the project, each beside its peers from ../shared/anchors/run.sh in the
# same command (these machines are shared and noisy: only figures taken side by side are compared).
# usage: bench/run_all.sh [BUILD_DIR]
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$top/build}
anchors=$top/../shared/anchors/run.sh
bin=$build/bin

echo "== physical limits of this host"
[ -x "$anchors" ] && "$anchors" limits || echo "(../shared/anchors/run.sh not found: peers skipped)"

echo; echo "== training step: tinyddp one process (against its GEMM-only bound), then 2 data-parallel ranks"
echo "   beside PyTorch DDP on 2 ranks; then PyTorch in one process"
if [ -x "$anchors" ]; then
  "$bin/train_bench" --world-size 2 --torch-anchor "$top/../shared/anchors/torch_ddp_train.py"
  /usr/bin/python3 "$top/../shared/anchors/torch_ddp_train.py" 1 784 1024 10 16384 256 2 || true
else
  "$bin/train_bench" --world-size 2
fi

echo; echo "== the seed job, whole process: tinyddp vs PyTorch"
/usr/bin/time -f "tinyddp dummy: %e s wall, %M KiB peak RSS" "$bin/dummy" --save "" >/dev/null
[ -x "$anchors" ] && /usr/bin/time -f "PyTorch seed job: %e s wall, %M KiB peak RSS (parent process)" \
  /usr/bin/python3 "$top/../shared/anchors/torch_ddp_train.py" 1 10 0 2 1000 32 10 || true

if [ -x "$bin/store_bench" ]; then
  echo; echo "== store"
  "$bin/store_bench"
fi
if [ -x "$top/bench/compare_allreduce.sh" ]; then
  echo; echo "== all-reduce"
  "$top/bench/compare_allreduce.sh" "$build"
fi
