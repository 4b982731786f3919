#!/usr/bin/env bash
# What a program that never touches a GPU pays for a CUDA-enabled build: the seed job (bin/dummy:
# Linear(10, 2), 1000 samples, batch 32, 10 epochs, Adam, cosine, one process) beside PyTorch's same
# job (bench/peers/torch_train.py with --hidden 0: Linear(10, 2)), alternating, ROUNDS times each:
# whole-process wall time and peak resident memory (GNU time's %e and %M).
#
# usage: bench/cuda_on_demand.sh [BUILD] [ROUNDS] [OTHER_DUMMY]
#   BUILD        the build folder (default build); its bin/dummy is measured
#   OTHER_DUMMY  optional: another bin/dummy to measure in the same rounds (an older build, say)
# As root it also runs bin/dummy with the CUDA libraries' folders hidden (an empty folder bound over
# each, in a private mount namespace): the same binary on a machine without them.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-build}; rounds=${2:-3}; other=${3:-}
dummy=$build/bin/dummy
torch_job=(/usr/bin/python3 "$here/peers/torch_train.py" --world 1 --in 10 --hidden 0 --out 2 --samples 1000 --batch 32
           --epochs 10)
[[ -x $dummy ]] || { echo "no $dummy: build first (make build)"; exit 1; }
[[ -f ${torch_job[1]} ]] || { echo "no ${torch_job[1]}: the PyTorch peer is not in this tree"; exit 1; }
/usr/bin/python3 -c "import torch" 2>/dev/null || { echo "PyTorch is missing: scripts/deps.sh --bench installs python3-torch"; exit 1; }

# The folders the CUDA half loads its libraries from, as the dynamic loader resolves them.
cuda_dirs() {
  for lib in "$build"/lib/libtinyddp_*.so; do
    [[ -e $lib ]] && ldd "$lib" | awk '/(cudart|cublas|nccl)/ && $3 ~ /^\// {print $3}'
  done | xargs -r -n1 dirname | xargs -r -n1 realpath | sort -u
}

report=$(mktemp)
measure() {  # label command...: one line "label wall_s peak_MB"; the command must succeed
  local label=$1; shift
  /usr/bin/time -f "%e %M" -o "$report" "$@" >/dev/null 2>&1 || { echo "$label: failed: $*"; exit 1; }
  awk -v l="$label" '{printf "%-28s %7.2f s %8.1f MB\n", l, $1, $2 / 1024}' "$report"
}

# A command prefix that runs what follows with every CUDA library folder hidden.
hidden=()
if [[ $(id -u) -eq 0 && -n $(cuda_dirs) ]]; then
  empty=$(mktemp -d); trap 'rmdir "$empty"; rm -f "$report"' EXIT
  binds=""
  for d in $(cuda_dirs); do binds+="mount --bind $empty $d; "; done
  hidden=(unshare --mount sh -c "mount --make-rprivate /; $binds exec \"\$@\"" sh)
  echo "rows marked CUDA hidden run with these folders hidden: $(cuda_dirs | xargs)"
fi

echo "host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "CUDA half of $build: $(ls "$build"/lib/libtinyddp_*.so 2>/dev/null | xargs -n1 basename | xargs) (loaded on first GPU use)"
echo "NVIDIA libraries bin/dummy links: $(ldd "$dummy" | awk '{print $1}' | grep -E 'cuda|cublas|nccl' | xargs || true)"
[[ -n $other ]] && echo "other dummy: $other, linking: $(ldd "$other" | awk '{print $1}' | grep -E 'cuda|cublas|nccl' | xargs || true)"
for ((i = 1; i <= rounds; i++)); do
  measure "tinyddp dummy" "$dummy" --save ""
  [[ -n $other ]] && measure "other dummy" "$other" --save ""
  measure "PyTorch 1.13 seed job" "${torch_job[@]}"
  if [[ ${#hidden[@]} -gt 0 ]]; then
    measure "tinyddp dummy, CUDA hidden" "${hidden[@]}" "$dummy" --save ""
  fi
done
