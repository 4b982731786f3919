#!/usr/bin/env bash
# Runs a test suite with one CPU GEMM library forced and held to one instruction set, so that one
# host checks the hosts below it: the kernels and nn suites run under each cap (test/CMakeLists.txt).
#
#   test/cpu_gemm_cap.sh onednn AVX512_CORE_BF16 -- build/bin/test_nn
#   test/cpu_gemm_cap.sh openblas SkylakeX -- build/bin/test_nn
#   test/cpu_gemm_cap.sh openblas own -- build/bin/test_nn      # OpenBLAS's own kernel choice
#
# oneDNN reads ONEDNN_MAX_CPU_ISA, OpenBLAS OPENBLAS_CORETYPE, each when it loads. A cap this CPU
# cannot run would quietly run something else (oneDNN stops at what the CPU has; OpenBLAS may crash
# on instructions it lacks), so such a run is skipped (exit 77, ctest's SKIP_RETURN_CODE) with the
# flags it misses.
set -euo pipefail
library=$1 cap=$2
shift 2
[ "${1:-}" = -- ] && shift

needed=()
case "$library:$cap" in
  onednn:AVX2 | openblas:Haswell) needed=(avx2 fma) ;;
  onednn:AVX512_CORE | openblas:SkylakeX) needed=(avx512f avx512cd avx512bw avx512dq avx512vl) ;;
  onednn:AVX512_CORE_BF16) needed=(avx512f avx512cd avx512bw avx512dq avx512vl avx512_vnni avx512_bf16) ;;
  onednn:AVX512_CORE_AMX) needed=(avx512f avx512cd avx512bw avx512dq avx512vl avx512_vnni avx512_bf16 amx_tile amx_bf16 amx_int8) ;;
  openblas:own) ;;
  *) echo "cpu_gemm_cap.sh: unknown cap '$library $cap'" >&2; exit 2 ;;
esac
flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
missing=()
for flag in "${needed[@]}"; do
  [[ "$flags" == *" $flag "* ]] || missing+=("$flag")
done
if [ ${#missing[@]} -gt 0 ]; then
  reason="$library held to $cap needs CPU flags this CPU lacks: ${missing[*]}"
  echo "skipped: $reason"
  [ -n "${TINYDDP_SKIP_LOG:-}" ] && printf '%s\tskipped\t%s\t%s\n' "$(basename "${1:-suite}")" "the whole suite" "$reason" >>"$TINYDDP_SKIP_LOG"
  exit 77
fi

export TINYDDP_CPU_GEMM=$library
if [ "$library" = onednn ]; then
  export ONEDNN_MAX_CPU_ISA=$cap
elif [ "$cap" = own ]; then
  unset OPENBLAS_CORETYPE
else
  export OPENBLAS_CORETYPE=$cap
fi
exec "$@"
