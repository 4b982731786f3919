// The CUDA side of fill_uniform: one thread per element, the same philox::uniform as the CPU loop.
#include "tinyddp/core/cuda_check.h"
#include "tinyddp/core/philox.h"

namespace tinyddp::cuda {

namespace {
__global__ void fill_uniform_kernel(float* out, int64_t n, uint64_t seed, uint64_t offset, float lo, float hi) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = philox::uniform(seed, offset, uint64_t(i), lo, hi);
}
}  // namespace

void fill_uniform(float* out, int64_t n, uint64_t seed, uint64_t offset, float lo, float hi, int device) {
  if (n == 0) return;
  // Kernels run on the calling thread's current device: it must be the one `out` lives on.
  CUDA_CHECK(cudaSetDevice(device));
  int threads = 256;
  int blocks = int((n + threads - 1) / threads < 4096 ? (n + threads - 1) / threads : 4096);
  fill_uniform_kernel<<<blocks, threads>>>(out, n, seed, offset, lo, hi);
  CUDA_CHECK_LAUNCH();
}

}  // namespace tinyddp::cuda
