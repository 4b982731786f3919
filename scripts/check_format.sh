#!/usr/bin/env bash
# Checks (or applies) the tree's .clang-format on its C++ sources: the libraries (core, kernels,
# comm, nn), the tests, the examples and the benchmarks; tracked files only.
#
# usage: scripts/check_format.sh [--fix | --count] [REPOSITORY_ROOT]
#   (default)  change nothing; list each file clang-format would change and exit 1 if there is one
#   --fix      format those files in place
#   --count    change nothing; print how many files and lines a --fix would change
#
# It needs clang-format 14 or newer (scripts/deps.sh --tests installs it); other versions break some lines
# differently, so the check names the version it ran.
set -euo pipefail
mode=check
case ${1:-} in
  --fix) mode=fix; shift ;;
  --count) mode=count; shift ;;
esac
root=$(cd "${1:-$(dirname "$0")/..}" && pwd)
cd "$root"
[[ -f .clang-format ]] || { echo "check_format: $root has no .clang-format" >&2; exit 2; }
formatter=${CLANG_FORMAT:-$(command -v clang-format-14 || command -v clang-format || true)}
# Exit 77 (ctest's "skipped") without one: make test installs it when it can, and goes on when it cannot.
[[ -n $formatter ]] || { echo "check_format: no clang-format found; hint: apt-get install clang-format" >&2; exit 77; }
version=$("$formatter" --version | grep -oE '[0-9]+\.[0-9]+\.[0-9]+' | head -1)

mapfile -t files < <(git ls-files -- 'core/*.h' 'core/*.cpp' 'core/*.cu' 'kernels/*.h' 'kernels/*.cpp' 'kernels/*.cu' \
  'kernels/*.cuh' 'comm/*.h' 'comm/*.cpp' 'comm/*.cu' 'nn/*.h' 'nn/*.cpp' 'test/*.h' 'test/*.cpp' 'examples/*.h' \
  'examples/*.cpp' 'bench/*.h' 'bench/*.cpp')

if [[ $mode == fix ]]; then
  printf '%s\0' "${files[@]}" | xargs -0 -r -n 50 "$formatter" -i --style=file
  echo "check_format: formatted ${#files[@]} files with clang-format $version"
  exit 0
fi

# "<lines that differ> <file>" for each file clang-format would change, the files checked in parallel.
export formatter
report=$(printf '%s\0' "${files[@]}" | xargs -0 -r -n 20 -P "$(nproc 2>/dev/null || echo 2)" sh -c '
  for f; do n=$("$formatter" --style=file "$f" | diff "$f" - | grep -c "^<"); [ "$n" -gt 0 ] && echo "$n $f"; done; true' _ |
  sort -k2)
unformatted=0
changed_lines=0
while read -r n f; do
  [[ -n $f ]] || continue
  unformatted=$((unformatted + 1))
  changed_lines=$((changed_lines + n))
  [[ $mode == check ]] && echo "$f: $n lines differ from .clang-format"
done <<<"$report"
if [[ $mode == count ]]; then
  echo "check_format: --fix would change $changed_lines lines in $unformatted of ${#files[@]} files (clang-format $version)"
  exit 0
fi
if (( unformatted )); then
  echo "check_format: $unformatted files are not formatted as .clang-format says (clang-format $version);" \
       "hint: scripts/check_format.sh --fix"
  exit 1
fi
echo "check_format: all ${#files[@]} files are formatted as .clang-format says (clang-format $version)"
