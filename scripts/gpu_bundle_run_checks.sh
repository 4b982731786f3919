#!/bin/bash
# tinyddp's GPU checks, from this bundle alone (made by scripts/gpu_bundle.sh; nothing is built or
# installed here). In order, stopping at the first that fails:
#   1 device-query     what the programs see of CUDA and NCCL (bin/test_gpu's device query)
#   2 gpu-suite        the GPU suite: every CUDA kernel against the CPU, the collectives, DDP, ZeRO-1
#                      and MultiDevice on the GPUs (bin/test_gpu, TINYDDP_REQUIRE_GPU=1)
#   3 all_reduce_perf  an NCCL all-reduce sweep on every GPU, each result checked (#wrong)
#   4 dummy_mgpu       the seed's training job on every GPU
# and then says which passed. Each check's output is also kept in a log folder (printed at the end).
# The libraries come from lib/ beside this script, then from LD_LIBRARY_PATH as given (the node's
# CUDA runtime, cuBLAS and NCCL: put a pip wheel's nvidia/nccl/lib there if that is where NCCL is).
# Exit status: 0 all passed; 2 no usable GPU here; 1 a check failed.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# The bundle's C++ runtime (lib/compat) only where the node's is older than the programs need: it asks
# for the build machine's glibc, which the node's own runtime does not (MANIFEST.txt).
if ldd "$here/bin/test_gpu" 2>&1 | grep -qE "(libstdc\+\+|libgcc_s)[^ ]* => not found|version .GLIBCXX_|version .GCC_|version .CXXABI_"; then
  echo "run_checks: this node's C++ runtime is older than the programs need: using the bundle's (lib/compat)"
  export LD_LIBRARY_PATH="$here/lib/compat:$LD_LIBRARY_PATH"
fi
export TINYDDP_PLUGIN_DIR="$here/lib"
export TINYDDP_REQUIRE_GPU=1
logs=${TINYDDP_CHECKS_LOG_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/tinyddp-gpu-checks.XXXXXX")}
mkdir -p "$logs"

checks=(device-query gpu-suite all_reduce_perf dummy_mgpu)
passed=()

summary() {
  local not_run=("${checks[@]:${#passed[@]}}")
  echo "run_checks: passed: ${passed[*]:-none}"
  [ ${#not_run[@]} -eq 0 ] || echo "run_checks: not passed: ${not_run[*]}"
  echo "run_checks: logs in $logs"
}

# run NAME COMMAND...: runs it with its output shown and kept; returns its status.
run() {
  local name=$1
  shift
  echo "== run_checks: $name: $*"
  (cd "$logs" && "$@") 2>&1 | tee "$logs/$name.log"
}

stop() {
  echo "run_checks: FAILED at $1: $2"
  summary
  exit "${3:-1}"
}

run device-query "$here/bin/test_gpu" --test-case="device query*" --no-intro=true
status=$?
gpus=$(sed -n 's/^cuda devices: \([0-9]*\)$/\1/p' "$logs/device-query.log" | head -1)
[ -n "$gpus" ] || stop device-query "bin/test_gpu did not run (exit $status): see its output above"
if [ "$gpus" = 0 ]; then
  why=$(sed -n 's/^no CUDA device: //p' "$logs/device-query.log" | head -1)
  echo "run_checks: there is no usable GPU on this machine (${why:-no reason given})."
  echo "run_checks: nothing ran on a GPU; these checks need a CUDA GPU and its driver (libcuda.so.1)."
  summary
  exit 2
fi
[ "$status" -eq 0 ] || stop device-query "bin/test_gpu's device query failed (exit $status)"
if nccl=$(grep -m1 '^nccl: unavailable: ' "$logs/device-query.log"); then
  stop device-query "${nccl#nccl: }; hint: put the folder that holds libnccl.so.2 (the CUDA toolkit's lib, or a pip wheel's nvidia/nccl/lib) on LD_LIBRARY_PATH"
fi
passed+=(device-query)

run gpu-suite "$here/bin/test_gpu" --test-case-exclude="device query*" --no-intro=true ||
  stop gpu-suite "bin/test_gpu failed (exit $?)"
passed+=(gpu-suite)

run all_reduce_perf "$here/bin/tinyddp-run" -n "$gpus" -- "$here/bin/all_reduce_perf" --backend nccl -b 8 -e 64M -f 8 -c 1 ||
  stop all_reduce_perf "the all-reduce sweep on $gpus GPUs failed (exit $?)"
passed+=(all_reduce_perf)

run dummy_mgpu "$here/bin/dummy_mgpu" --device cuda --epochs 2 --save "" ||
  stop dummy_mgpu "the training job on $gpus GPUs failed (exit $?)"
passed+=(dummy_mgpu)

summary
echo "run_checks: all ${#checks[@]} checks passed on $gpus GPU(s)"
