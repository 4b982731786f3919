#!/usr/bin/env bash
# Builds the libFuzzer target for the safetensors reader with clang (ASan + UBSan).
# usage: test/fuzz/build.sh [output folder, default build-fuzz]
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-build-fuzz}
mkdir -p "$out"
command -v clang++ >/dev/null || { echo "fuzz: clang++ is needed (apt-get install clang)"; exit 1; }
# core's sources without CUDA: the reader needs tensors, storage, dtypes and errors only.
clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -I. \
  test/fuzz/fuzz_safetensors.cpp core/safetensors.cpp core/tensor.cpp core/storage.cpp core/allocator.cpp \
  core/dtype.cpp core/device.cpp core/error.cpp core/cuda_runtime.cpp -o "$out/fuzz_safetensors"
mkdir -p "$out/corpus"
echo "built $out/fuzz_safetensors; run: $out/fuzz_safetensors -max_total_time=60 $out/corpus test/fixtures"
