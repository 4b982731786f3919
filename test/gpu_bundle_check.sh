#!/bin/bash
# The GPU bundle (scripts/gpu_bundle.sh) works away from the build: it is made, unpacked into a fresh
# folder elsewhere, and run there with an almost empty environment (env -i: PATH, HOME and TMPDIR
# only) and only its own lib/ on the library path, as on an air-gapped GPU node:
#   - ldd of every program and module finds each library it does not leave to the node in the
#     bundle's lib/, and none in the build or source tree;
#   - its programs run: tinyddp-run starts all_reduce_perf on 2 CPU ranks, dummy_mgpu trains on 2
#     fake GPUs (the examples built in this tree carry the fakes: TINYDDP_FAKE_CUDA_DEVICES), and the
#     GPU suite's device query says what it sees;
#   - run_checks.sh says there is no GPU here, exits 2 and lists nothing as passed; with stand-ins
#     for its programs on "2 GPUs", it runs the four checks in order, or stops at the first failure;
#   - its compare_nccl.sh pairs ours on 2 fake GPUs with a stand-in for nccl-tests that prints a real
#     nccl-tests run's table, and refuses a peer that is not there, and (with no GPU) a missing count;
#   - an archive over its limit fails, naming its largest parts.
#   test/gpu_bundle_check.sh SOURCE_DIR BUILD_DIR
set -uo pipefail

export GPU_BUNDLE_GZIP_LEVEL=1  # packing speed only: the same contents, a slightly larger archive
source_dir=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu-bundle-check.XXXXXX")
trap 'rm -rf "$work"' EXIT
failures=0
check() {  # check DESCRIPTION COMMAND...: runs the command, counts a failure with its description
  local what=$1
  shift
  if "$@"; then echo "ok: $what"; else echo "FAILED: $what" >&2; failures=$((failures + 1)); fi
}

"$source_dir/scripts/gpu_bundle.sh" "$build" "$work/tinyddp-gpu-bundle.tar.gz" || { echo "FAILED: making the bundle" >&2; exit 1; }
mkdir "$work/node"
tar -C "$work/node" -xzf "$work/tinyddp-gpu-bundle.tar.gz"
bundle=$work/node/tinyddp-gpu-bundle
mkdir "$work/home"
bare() { env -i PATH=/usr/bin:/bin HOME="$work/home" TMPDIR="$work" LD_LIBRARY_PATH="$bundle/lib" "$@"; }

# ldd, as the node's loader would see it. The NVIDIA libraries and glibc are the node's (MANIFEST.txt).
node_provided='^(libcuda\.so|libcudart\.so|libcublas\.so|libcublasLt\.so|libnccl\.so|libnvidia-)'
glibc='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so)'
compat='^(libstdc\+\+\.so|libgcc_s\.so)'  # the node's, or lib/compat's where the node's is too old
resolves_from_bundle() {
  local file=$1 ok=0 name path
  while read -r name _ path _; do
    [[ $name =~ $glibc || $name =~ $node_provided || $name =~ $compat || $name == /* ]] && continue
    if [[ $path != "$bundle/lib/"* ]]; then
      echo "  $(basename "$file"): $name resolves to ${path:-nothing}, not the bundle's lib/" >&2
      ok=1
    fi
  done < <(bare ldd "$file" | grep '=>')
  if bare ldd "$file" | grep -E "$build|$source_dir" >&2; then
    echo "  $(basename "$file"): resolves from the build or source tree" >&2
    ok=1
  fi
  return $ok
}
for f in "$bundle"/bin/* "$bundle"/lib/*.so* "$bundle"/lib/compat/*; do
  check "ldd $(basename "$f"): its libraries from the bundle or the node, none from the build tree" resolves_from_bundle "$f"
done
check "OpenBLAS and its Fortran runtime are in the bundle, the C++ runtime in lib/compat" \
  test -f "$bundle/lib/libopenblas.so.0" -a -f "$bundle/lib/libgfortran.so.5" -a -f "$bundle/lib/compat/libstdc++.so.6"
check "no NVIDIA library is bundled" bash -c "! ls '$bundle/lib' | grep -E '$node_provided'"
check "MANIFEST.txt names what the node provides and the glibc needed" \
  bash -c "grep -q '^  libcudart.so' '$bundle/MANIFEST.txt' && grep -q '^  libnccl.so' '$bundle/MANIFEST.txt' && grep -q '^needs glibc: 2\.' '$bundle/MANIFEST.txt'"

cd "$work/home" || exit 1
check "tinyddp-run starts the bundle's all_reduce_perf on 2 CPU ranks, results checked" \
  bash -c "$(declare -f bare); bundle='$bundle' work='$work'; bare '$bundle/bin/tinyddp-run' -n 2 -- '$bundle/bin/all_reduce_perf' -b 8 -e 4K -f 8 -c 1 -n 2 >'$work/perf.log' 2>&1 && grep -q 'Avg bus bandwidth' '$work/perf.log' && grep -q '# Out of bounds values : 0 OK' '$work/perf.log'" ||
  cat "$work/perf.log" >&2
check "the bundle's dummy_mgpu trains on 2 fake GPUs" \
  bash -c "$(declare -f bare); bundle='$bundle' work='$work'; bare TINYDDP_FAKE_CUDA_DEVICES=2 '$bundle/bin/dummy_mgpu' --epochs 1 --samples 200 --save '' >'$work/mgpu.log' 2>&1" ||
  cat "$work/mgpu.log" >&2

bare "$bundle/bin/test_gpu" --test-case="device query*" --no-intro=true >"$work/query.log" 2>&1
cat "$work/query.log"
if grep -q '^cuda devices: 0$' "$work/query.log"; then
  bare "$bundle/run_checks.sh" >"$work/checks.log" 2>&1
  status=$?
  cat "$work/checks.log"
  check "run_checks.sh exits 2 where there is no GPU" test "$status" -eq 2
  check "run_checks.sh says there is no GPU here and that nothing passed" \
    bash -c "grep -q 'there is no usable GPU on this machine' '$work/checks.log' && grep -q 'passed: none' '$work/checks.log'"
elif grep -q '^cuda devices: [1-9]' "$work/query.log"; then
  echo "note: a GPU is here, so run_checks.sh is not run by this test (it would run every GPU check): run it by hand"
else
  check "the bundle's device query says how many CUDA devices it sees" false
fi

# run_checks.sh's order on a machine with GPUs, with stand-ins for its programs (a 2-GPU device query,
# a GPU suite that fails when SUITE_STATUS says so): all four pass, or it stops at the suite and says
# what passed and what did not.
stand_in=$work/stand-in
mkdir -p "$stand_in/bin" "$stand_in/lib"
cp "$bundle/run_checks.sh" "$stand_in/"
cat >"$stand_in/bin/test_gpu" <<'STAND_IN'
#!/bin/sh
case "$1" in --test-case=*) echo "cuda devices: 2"; echo "nccl: available"; exit 0 ;; esac
exit "${SUITE_STATUS:-0}"
STAND_IN
printf '#!/bin/sh\necho "$0 $*" >>"$TMPDIR/ran"\n' >"$stand_in/bin/tinyddp-run"
cp "$stand_in/bin/tinyddp-run" "$stand_in/bin/dummy_mgpu"
chmod +x "$stand_in"/bin/*
bare "$stand_in/run_checks.sh" >"$work/stand-in.log" 2>&1
check "run_checks.sh on 2 stand-in GPUs: all 4 checks pass, in order" \
  bash -c "grep -q 'passed: device-query gpu-suite all_reduce_perf dummy_mgpu' '$work/stand-in.log' && grep -q 'all 4 checks passed on 2 GPU' '$work/stand-in.log' && grep -q 'tinyddp-run -n 2 -- .*all_reduce_perf --backend nccl' '$work/ran'"
bare SUITE_STATUS=3 "$stand_in/run_checks.sh" >"$work/stand-in.log" 2>&1
status=$?
check "run_checks.sh stops at a failing GPU suite, exits 1 and says what passed" \
  bash -c "[ $status -eq 1 ] && grep -q 'FAILED at gpu-suite: bin/test_gpu failed (exit 3)' '$work/stand-in.log' && grep -q 'passed: device-query$' '$work/stand-in.log' && grep -q 'not passed: gpu-suite all_reduce_perf dummy_mgpu' '$work/stand-in.log'"

# compare_nccl.sh beside a stand-in for nccl-tests that prints what nccl-tests 2.19.6 printed on an H200
# (test/fixtures/nccl_tests_all_reduce_perf_h200.txt): every size both ran pairs ours with its time
# there, and the ratio is that time over ours.
printf '#!/bin/sh\ncat "%s"\n' "$source_dir/test/fixtures/nccl_tests_all_reduce_perf_h200.txt" >"$work/nccl-tests"
chmod +x "$work/nccl-tests"
bare TINYDDP_FAKE_CUDA_DEVICES=2 TINYDDP_BENCH_QUICK=1 OUT_DIR="$work/bench-nccl" "$bundle/compare_nccl.sh" \
  "$work/nccl-tests" 2 >"$work/compare.log" 2>&1
status=$?
cat "$work/compare.log"
check "compare_nccl.sh: ours on 2 fake GPUs beside nccl-tests' rows, ratio = nccl-tests' time / ours" \
  python3 - "$work/compare.log" "$status" <<'CHECK'
import sys
text = open(sys.argv[1]).read()
assert sys.argv[2] == "0", "exit " + sys.argv[2]
assert "2 x GPU" in text and "NCCL 2.28.3" in text, "the header names the GPUs and the peer's NCCL"
rows = {int(f[0]): f for f in (line.replace("|", " ").split() for line in text.splitlines()) if f and f[0].isdigit()}
expected_peer = {8: 7.40, 64: 7.57, 512: 7.33, 4096: 6.93}  # the fixture's out-of-place times
for size, peer in expected_peer.items():
    ours0, peer0, ratio0, ours1, peer1, ratio1 = rows[size][1:7]
    for ours, shown, ratio in ((ours0, peer0, ratio0), (ours1, peer1, ratio1)):
        assert float(shown) == peer, (size, shown)
        assert abs(float(ratio.rstrip("x")) - peer / float(ours)) <= 0.006, (size, ratio, ours)
assert rows[134217728][1] == "-", "a size only nccl-tests ran has no figure of ours"
CHECK
bare "$bundle/compare_nccl.sh" "$work/no-such-program" 2 >"$work/compare-bad.log" 2>&1
status=$?
check "compare_nccl.sh refuses a peer that is not there, naming it (exit 2)" \
  bash -c "[ $status -eq 2 ] && grep -q 'no-such-program is not an executable file' '$work/compare-bad.log'"
if grep -q '^cuda devices: 0$' "$work/query.log"; then
  bare "$bundle/compare_nccl.sh" "$work/nccl-tests" >"$work/compare-bad.log" 2>&1
  status=$?
  check "compare_nccl.sh with no GPU and no count says so (exit 2)" \
    bash -c "[ $status -eq 2 ] && grep -q 'lists no GPU here' '$work/compare-bad.log'"
fi

GPU_BUNDLE_LIMIT_MIB=1 "$source_dir/scripts/gpu_bundle.sh" "$build" "$work/small.tar.gz" >"$work/limit.log" 2>&1
status=$?
check "an archive over its limit fails, naming its largest parts" \
  bash -c "[ $status -ne 0 ] && grep -q 'over its limit of 1 MiB; its largest parts: lib/' '$work/limit.log' && [ ! -e '$work/small.tar.gz' ]"

[ "$failures" -eq 0 ] || { echo "$failures check(s) failed" >&2; exit 1; }
echo "the GPU bundle runs from $bundle with only its own lib/"
