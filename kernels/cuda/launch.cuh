// What every tinyddp CUDA kernel shares: the launch shape, grid-stride indexing, the device guard and
// warp-level reductions. Included by kernels/cuda/*.cu only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "tinyddp/core/cuda_check.h"

namespace tinyddp::kernels::cuda::detail {

// 256 threads per block is a good default on every GPU since Kepler: 8 warps, enough for latency
// hiding, few enough to leave registers to spare.
constexpr int kThreads = 256;
constexpr int kWarp = 32;
// Kernels loop over their elements with a grid-stride loop, so the grid need not cover n: 4096 blocks
// of 256 threads keep any current GPU busy (an H100 runs 132 SMs x 2048 threads = 1056 such blocks at
// once) without launching millions of blocks for a large tensor.
constexpr int64_t kMaxBlocks = 4096;

// Blocks for `work_items` items handled `per_block` at a time: at least 1, at most kMaxBlocks.
inline int blocks_for(int64_t work_items, int64_t per_block = kThreads) {
  int64_t blocks = (work_items + per_block - 1) / per_block;
  return int(blocks < 1 ? 1 : blocks > kMaxBlocks ? kMaxBlocks : blocks);
}

// Kernels run on the current device; the tensors' device must be made current before each launch.
inline void use_device(int device) { CUDA_CHECK(cudaSetDevice(device)); }

// The grid-stride loop: thread t handles t, t + T, t + 2T, ... where T is the number of threads.
__device__ inline int64_t first_index() { return int64_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ inline int64_t grid_stride() { return int64_t(gridDim.x) * blockDim.x; }

// Butterfly reductions inside one warp: after log2(32) = 5 exchanges every lane holds the result.
// All 32 lanes must call them (the callers keep whole warps on the same loop trip).
__device__ inline float warp_max(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}
__device__ inline float warp_sum(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

}  // namespace tinyddp::kernels::cuda::detail
