#!/bin/bash
# Packs what a GPU node needs to run tinyddp's GPU checks without building anything (make gpu-bundle):
# GPU nodes of clusters are often air-gapped, with no compiler and no dev packages, so `make test-gpu`
# cannot run there. The bundle holds
#   bin/  test_gpu (the GPU suite), the perf programs, dummy_mgpu, tinyddp-run, tinyddp-store
#   lib/  the two CUDA modules (libtinyddp_cuda.so, libtinyddp_nccl.so) and every shared library they
#         and the programs need that a bare CUDA node may lack: found with ldd, plus the libraries
#         tinyddp dlopens itself (oneDNN, when the build has it), with their own dependencies;
#         lib/compat: the C++ runtime (libstdc++, libgcc_s), used only where the node's is too old
#   run_checks.sh  the checks in order; MANIFEST.txt  what is inside, from where, and what the node provides
#   compare_nccl.sh  the all-reduce over NCCL beside nccl-tests' (bench/compare_nccl.sh; nccl-tests not included)
# Left out on purpose, and listed in MANIFEST.txt: the NVIDIA libraries the node provides and that must
# match its driver (libcuda, libcudart, cuBLAS, NCCL, libnvidia-*), and glibc itself (libc, libm, libdl,
# libpthread, librt, the dynamic loader: a program cannot bring its own; MANIFEST.txt names the
# glibc version the bundle needs).
#
#   scripts/gpu_bundle.sh [BUILD_DIR [ARCHIVE]]   (default: build, BUILD_DIR/tinyddp-gpu-bundle.tar.gz)
# GPU_BUNDLE_LIMIT_MIB (default 64): the archive's limit; a larger archive fails, naming its biggest parts.
# GPU_BUNDLE_GZIP_LEVEL (default 6): 1 packs three times faster into an archive about a sixth larger.
set -euo pipefail

build=${1:-build}
archive=${2:-$build/tinyddp-gpu-bundle.tar.gz}
limit_mib=${GPU_BUNDLE_LIMIT_MIB:-64}
source_dir=$(cd "$(dirname "$0")/.." && pwd)

fail() {
  echo "gpu_bundle: $*" >&2
  exit 1
}

programs=(test_gpu all_reduce_perf all_gather_perf reduce_scatter_perf broadcast_perf dummy_mgpu tinyddp-run tinyddp-store)
modules=(libtinyddp_cuda.so libtinyddp_nccl.so)
missing=()
for p in "${programs[@]}"; do [ -x "$build/bin/$p" ] || missing+=("bin/$p"); done
for m in "${modules[@]}"; do [ -f "$build/lib/$m" ] || missing+=("lib/$m"); done
if [ ${#missing[@]} -gt 0 ]; then
  why=""
  if [ -f "$build.configure.log" ] && grep -q 'CUDA *: no' "$build.configure.log"; then
    why=" ($(grep -m1 'CUDA *: no' "$build.configure.log" | sed 's/^-- *//'))"
  fi
  fail "$build lacks ${missing[*]}$why; hint: build with CUDA and NCCL on a machine with nvcc (make gpu-bundle builds the programs)"
fi
command -v ldd >/dev/null || fail "ldd not found; hint: install libc-bin"

# Provided by the node, never bundled: the NVIDIA libraries (they must match the node's driver and
# toolkit; NCCL may come from a pip wheel's nvidia/nccl/lib, put on LD_LIBRARY_PATH) and glibc.
node_provided='^(libcuda\.so|libcudart\.so|libcublas\.so|libcublasLt\.so|libnccl\.so|libnvidia-|libnvrtc|libnvJitLink|libcudadebugger)'
glibc='^(linux-vdso\.so|linux-gate\.so|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libresolv\.so|libutil\.so|libmvec\.so)'

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root=$work/tinyddp-gpu-bundle
mkdir -p "$root/bin" "$root/lib"
for p in "${programs[@]}"; do cp "$build/bin/$p" "$root/bin/"; done
for m in "${modules[@]}"; do cp "$build/lib/$m" "$root/lib/"; done

# The libraries tinyddp dlopens by name, which ldd cannot see: oneDNN (kernels/cpu_gemm_onednn.cpp),
# when the programs name it. libcuda.so.1 (core/cuda_driver.cpp) is the node's.
dlopened=()
for name in $(strings "$build/bin/test_gpu" | grep -oE '^libdnnl\.so\.[0-9]+$' | sort -u); do
  path=$(ldconfig -p 2>/dev/null | awk -v n="$name" '$1 == n && /x86-64|x86_64|64bit/ && !found { print $NF; found = 1 }')
  if [ -n "$path" ]; then dlopened+=("$path"); else echo "gpu_bundle: $name (dlopened by the CPU GEMM) is not installed here: not bundled; the node falls back to OpenBLAS"; fi
done

declare -A bundled=() provided=() origin=()
add_dependencies_of() {  # every library ldd resolves for $1, sorted into bundled / node-provided / glibc
  local line name path
  while IFS= read -r line; do
    name=$(echo "$line" | awk '{print $1}')
    path=$(echo "$line" | awk '$2 == "=>" { print $3 }')
    [ -n "$name" ] || continue
    case "$name" in /*) name=$(basename "$name") ;; esac
    if [[ $name =~ $glibc ]]; then continue; fi
    if [[ $name =~ $node_provided ]]; then
      provided[$name]=${path:-not found here}
      continue
    fi
    [ "$path" != "not" ] && [ -n "$path" ] || fail "$1 needs $name, which ldd cannot find here; hint: install it, then bundle again"
    case "$name" in libtinyddp_*) continue ;; esac  # the modules are bundled already
    bundled[$name]=$(readlink -f "$path")
    origin[$name]=$path
  done < <(ldd "$1" 2>/dev/null | grep -v 'statically linked')
}
for f in "$root"/bin/* "$root"/lib/*.so "${dlopened[@]}"; do add_dependencies_of "$f"; done
for path in "${dlopened[@]}"; do bundled[$(basename "$path")]=$(readlink -f "$path"); origin[$(basename "$path")]=$path; done
# The bundled libraries' own dependencies (ldd lists the whole closure, so one more pass finds any
# that only a dlopened library brings).
for name in "${!bundled[@]}"; do add_dependencies_of "${bundled[$name]}"; done
# The C++ runtime goes to lib/compat: it needs the glibc of the build machine (newer than what the
# programs themselves need), so run_checks.sh uses it only where the node's own is too old for them.
compat='^(libstdc\+\+\.so|libgcc_s\.so)'
mkdir -p "$root/lib/compat"
for name in "${!bundled[@]}"; do
  if [[ $name =~ $compat ]]; then cp "${bundled[$name]}" "$root/lib/compat/$name"; else cp "${bundled[$name]}" "$root/lib/$name"; fi
done

# The newest glibc symbol version anything in the bundle asks for: the oldest glibc it runs on.
newest_glibc() { objdump -T "$@" 2>/dev/null | grep -oE 'GLIBC_[0-9]+\.[0-9]+(\.[0-9]+)?' | sort -t. -k1,1 -k2,2n -k3,3n -u | tail -1; }
glibc_needed=$(newest_glibc "$root"/bin/* "$root"/lib/*.so*)
glibc_compat=$(newest_glibc "$root"/lib/compat/*)

{
  echo "tinyddp GPU bundle, made $(date -u +%Y-%m-%dT%H:%M:%SZ) from $(git -C "$source_dir" describe --always --dirty 2>/dev/null || echo 'an unknown commit')"
  echo "built on: $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME"), $(uname -m)"
  echo "needs glibc: ${glibc_needed#GLIBC_} or newer (ldd --version on the node); ${glibc_compat#GLIBC_} where the node's C++ runtime"
  echo "  is older than the build's, and run_checks.sh takes lib/compat's (libstdc++, libgcc_s) instead"
  echo
  echo "programs (bin/):"
  for p in "${programs[@]}"; do echo "  $p"; done
  echo "CUDA modules (lib/):"
  for m in "${modules[@]}"; do echo "  $m"; done
  echo "bundled libraries (lib/), each from:"
  for name in $(printf '%s\n' "${!bundled[@]}" | sort); do
    where=lib
    [[ $name =~ $compat ]] && where=lib/compat
    echo "  $where/$name  <- ${origin[$name]}"
  done
  echo "provided by the node, not bundled (its NVIDIA driver, CUDA runtime, cuBLAS and NCCL; put a pip"
  echo "wheel's nvidia/*/lib folders on LD_LIBRARY_PATH if that is where they are):"
  for name in $(printf '%s\n' "${!provided[@]}" | sort); do echo "  $name"; done
  echo "  libcuda.so.1 (the driver; loaded at run time)"
  echo "and glibc (libc, libm, libdl, libpthread, librt, the dynamic loader)."
} >"$root/MANIFEST.txt"

cp "$source_dir/scripts/gpu_bundle_run_checks.sh" "$root/run_checks.sh"
cp "$source_dir/bench/compare_nccl.sh" "$root/compare_nccl.sh"
chmod +x "$root/run_checks.sh" "$root/compare_nccl.sh"

mkdir -p "$(dirname "$archive")"
tar -C "$work" -cf - tinyddp-gpu-bundle | gzip "-${GPU_BUNDLE_GZIP_LEVEL:-6}" >"$archive.tmp"
bytes=$(stat -c %s "$archive.tmp")
unpacked=$(du -sb "$root" | awk '{print $1}')
if [ "$bytes" -gt $((limit_mib * 1024 * 1024)) ]; then
  rm -f "$archive.tmp"
  fail "the archive is $((bytes / 1048576)) MiB, over its limit of $limit_mib MiB; its largest parts: $(cd "$root" && du -b bin/* lib/* | sort -rn | head -4 | awk '{printf "%s %d MiB; ", $2, $1 / 1048576}')hint: drop what the node has, or raise GPU_BUNDLE_LIMIT_MIB"
fi
mv "$archive.tmp" "$archive"
echo "gpu_bundle: $archive: $((bytes / 1048576)) MiB ($((unpacked / 1048576)) MiB unpacked; limit $limit_mib MiB), ${#bundled[@]} libraries bundled, ${#provided[@]} left to the node"
echo "  on the node: tar xzf $(basename "$archive") && tinyddp-gpu-bundle/run_checks.sh"
echo "  beside nccl-tests: tinyddp-gpu-bundle/compare_nccl.sh <nccl-tests' all_reduce_perf>"
