// The optimizer updates on the GPU: one thread per element (grid-stride), each calling the same
// sgd_update / adam_update as the CPU loop. The step's scalars arrive by value in kernel arguments.
#include "tinyddp/kernels/cuda/cuda_kernels.h"
#include "tinyddp/kernels/cuda/launch.cuh"

namespace tinyddp::kernels::cuda {

namespace {

using detail::first_index;
using detail::grid_stride;

__global__ void sgd_kernel(float* param, const float* grad, float* momentum_buffer, int64_t n, SgdScalars s) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    float unused = 0.f;  // without momentum there is no buffer, and sgd_update does not touch it
    sgd_update(param[i], grad[i], momentum_buffer ? momentum_buffer[i] : unused, s);
  }
}

__global__ void adam_kernel(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                            AdamScalars s) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    adam_update(param[i], grad[i], exp_avg[i], exp_avg_sq[i], s);
}

}  // namespace

void sgd_step(int device, float* param, const float* grad, float* momentum_buffer, int64_t n, const SgdScalars& s) {
  if (n == 0) return;
  detail::use_device(device);
  sgd_kernel<<<detail::blocks_for(n), detail::kThreads>>>(param, grad, momentum_buffer, n, s);
  CUDA_CHECK_LAUNCH();
}

void adam_step(int device, float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
               const AdamScalars& s) {
  if (n == 0) return;
  detail::use_device(device);
  adam_kernel<<<detail::blocks_for(n), detail::kThreads>>>(param, grad, exp_avg, exp_avg_sq, n, s);
  CUDA_CHECK_LAUNCH();
}

}  // namespace tinyddp::kernels::cuda
