#!/usr/bin/env bash
# Checks the library folders' includes against the dependency rules of docs/architecture.md:
#
#   core     includes core only
#   kernels  includes core and kernels
#   comm     includes core and comm
#   nn       includes core, kernels, nn, and of comm only its public headers (below)
#
# The link lines in CMakeLists.txt already keep a library from calling one it does not link; they
# cannot keep nn from including comm's internals (the algorithm engine, the NCCL half's interface, the
# store server), since nn links comm. Those internals may change shape at any time; the public headers
# are what a training program uses and what nn may lean on.
#
# usage: scripts/check_layering.sh [REPOSITORY_ROOT]    exit 0: every include keeps the rules;
#                                                        exit 1: each one that breaks them is listed
set -euo pipefail
root=$(cd "${1:-$(dirname "$0")/..}" && pwd)
cd "$root"

# comm's public headers: the process group and its collectives, the store, joining a job
# (rendezvous), from a failing worker, telling the launcher (docs/launchers.md), and which CPUs a
# launcher starts each worker on (MultiDevice spawns workers as tinyddp-run does).
comm_public=(
  comm/process_group.h comm/work.h comm/reduce_op.h comm/timeout.h comm/chunks.h
  comm/store/store.h comm/store/tcp_store.h comm/store/prefix_store.h comm/store/barrier.h comm/store/rendezvous.h
  comm/launch/failure_report.h comm/cpu_binding.h
)

allowed() {  # allowed FOLDER INCLUDED_PATH
  local folder=$1 included=$2 top=${2%%/*}
  case $folder in
    core) [[ $top == core ]] ;;
    kernels) [[ $top == core || $top == kernels ]] ;;
    comm) [[ $top == core || $top == comm ]] ;;
    nn)
      [[ $top == core || $top == kernels || $top == nn ]] && return 0
      local public
      for public in "${comm_public[@]}"; do [[ $included == "$public" ]] && return 0; done
      return 1 ;;
  esac
}

found=0
for folder in core kernels comm nn; do
  [[ -d $folder ]] || continue
  while IFS= read -r hit; do
    file=${hit%%:*}
    rest=${hit#*:}
    line=${rest%%:*}
    included=$(sed -E 's/.*#[[:space:]]*include[[:space:]]*"tinyddp\/([^"]+)".*/\1/' <<<"$rest")
    if ! allowed "$folder" "$included"; then
      echo "$file:$line: includes tinyddp/$included, which $folder/ may not include"
      found=1
    fi
  done < <(find "$folder" -type f \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' \) -print0 |
           xargs -0 -r grep -Hn -E '^[[:space:]]*#[[:space:]]*include[[:space:]]*"tinyddp/' || true)
done
if (( found )); then
  echo "check_layering: the includes above break the layering (core <- kernels <- nn, core <- comm <- nn;"
  echo "  nn sees comm through: ${comm_public[*]})"
  exit 1
fi
echo "check_layering: core, kernels, comm and nn include only what the layering allows"
