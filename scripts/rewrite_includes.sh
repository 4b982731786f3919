#!/usr/bin/env bash
# Rewrites tinyddp's includes of its own headers from the short form to the installed one:
#
#   #include "core/tensor.h"   ->   #include "tinyddp/core/tensor.h"
#
# for the four library folders (core, kernels, comm, nn), in every tracked C++ and CUDA source of the
# tree (the libraries, tests, benchmarks, examples), and then turns TINYDDP_SHORT_INCLUDES off in
# cmake/TinyddpInstall.cmake. Why: an installed header that includes "core/tensor.h" finds a user's
# own core/tensor.h first when the user's folders come earlier on the include path; "tinyddp/core/
# tensor.h" cannot be mistaken. Inside the tree the new form resolves through <build>/include/tinyddp
# (cmake/TinyddpInstall.cmake), so nothing else changes.
#
# Mechanical and idempotent: only includes that start with one of the four folder names are touched,
# and a rewritten one starts with "tinyddp/", so a second run changes nothing.
#
# usage: scripts/rewrite_includes.sh [--check] [REPOSITORY_ROOT]
#   (default)  rewrite, then print how many includes in how many files changed
#   --check    change nothing; list the includes still in the short form and exit 1 if there are any
set -euo pipefail
check=0
if [[ ${1:-} == --check ]]; then check=1; shift; fi
root=$(cd "${1:-$(dirname "$0")/..}" && pwd)
cd "$root"
[[ -f cmake/TinyddpInstall.cmake ]] || { echo "rewrite_includes: $root is not a tinyddp tree (no cmake/TinyddpInstall.cmake)" >&2; exit 2; }

# Tracked files when this is a git checkout (nothing under build folders), else every source file.
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files -- '*.h' '*.hpp' '*.cpp' '*.cu' '*.cuh')
else
  mapfile -t files < <(find . -path './build*' -prune -o -type f \( -name '*.h' -o -name '*.hpp' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' \) -print | sed 's|^\./||')
fi

short='^[[:space:]]*#[[:space:]]*include[[:space:]]*"(core|kernels|comm|nn)/'
if (( check )); then
  found=0
  for f in "${files[@]}"; do
    if grep -En "$short" "$f" /dev/null; then found=1; fi
  done
  if (( found )); then echo "rewrite_includes --check: the includes above are still in the short form; run scripts/rewrite_includes.sh"; exit 1; fi
  echo "rewrite_includes --check: every include of core/, kernels/, comm/, nn/ is written as tinyddp/..."
  exit 0
fi

changed_files=0
changed_lines=0
for f in "${files[@]}"; do
  n=$(grep -Ec "$short" "$f" || true)
  (( n > 0 )) || continue
  sed -E -i 's@^([[:space:]]*#[[:space:]]*include[[:space:]]*")(core|kernels|comm|nn)/@\1tinyddp/\2/@' "$f"
  changed_files=$((changed_files + 1))
  changed_lines=$((changed_lines + n))
done
sed -i 's/^set(TINYDDP_SHORT_INCLUDES ON)/set(TINYDDP_SHORT_INCLUDES OFF)/' cmake/TinyddpInstall.cmake
echo "rewrite_includes: $changed_lines includes in $changed_files files now read \"tinyddp/<folder>/...\"; TINYDDP_SHORT_INCLUDES is OFF"
