// Summing a per-element term over n elements into one host double, deterministically.
//
// atomicAdd of partial sums would finish in whatever order the blocks happen to run, so the last bits
// of a loss would change from run to run. Here the order is fixed: stage 1 gives every block a fixed
// grid-stride share and a fixed shared-memory tree; stage 2 sums the per-block partials in one block,
// again in a fixed tree. Same input, same grid, same bits.
//
// `Term` is a functor with `__device__ double operator()(int64_t i) const` (a struct, not a lambda:
// device lambdas need nvcc's --extended-lambda). It may also write outputs, e.g. a gradient element,
// which fuses "compute the gradient" and "sum the loss" into one pass.
#pragma once

#include "tinyddp/kernels/cuda/launch.cuh"
#include "tinyddp/kernels/cuda/scratch.h"

namespace tinyddp::kernels::cuda::detail {

// Tree sum of one value per thread in shared memory; thread 0 gets the block's total.
__device__ inline double block_sum(double value, double* shared) {
  shared[threadIdx.x] = value;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (int(threadIdx.x) < half) shared[threadIdx.x] += shared[threadIdx.x + half];
    __syncthreads();
  }
  return shared[0];
}

template <typename Term>
__global__ void __launch_bounds__(kThreads) partial_sums_kernel(Term term, int64_t n, double* partials) {
  __shared__ double shared[kThreads];
  double sum = 0.0;
  for (int64_t i = first_index(); i < n; i += grid_stride()) sum += term(i);
  double total = block_sum(sum, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

// static: a plain (non-template) kernel defined in a header gets one copy per including file.
static __global__ void __launch_bounds__(kThreads)
    sum_partials_kernel(const double* partials, int count, double* result) {
  __shared__ double shared[kThreads];
  double sum = 0.0;
  for (int i = threadIdx.x; i < count; i += kThreads) sum += partials[i];
  double total = block_sum(sum, shared);
  if (threadIdx.x == 0) *result = total;
}

// Sum over i in [0, n) of term(i), returned to the host (this waits for the device).
template <typename Term>
double sum_to_host(int device, int64_t n, const Term& term) {
  use_device(device);
  const int blocks = blocks_for(n);
  // partials[0, blocks) then the result, in this thread's scratch: no cudaMalloc per call.
  double* partials = static_cast<double*>(scratch(device, Scratch::partial_sums, size_t(blocks + 1) * sizeof(double)));
  partial_sums_kernel<<<blocks, kThreads>>>(term, n, partials);
  CUDA_CHECK_LAUNCH();
  sum_partials_kernel<<<1, kThreads>>>(partials, blocks, partials + blocks);
  CUDA_CHECK_LAUNCH();
  double result = 0.0;
  // A blocking copy on the default stream: it starts after both kernels and returns when it is done.
  CUDA_CHECK(cudaMemcpy(&result, partials + blocks, sizeof(double), cudaMemcpyDeviceToHost));
  return result;
}

}  // namespace tinyddp::kernels::cuda::detail
