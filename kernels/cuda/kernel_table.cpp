// The CUDA half's table of kernels (kernels/cuda/cuda_kernels.h), handed out by name after dlopen.
#include "tinyddp/core/cuda_api.h"
#include "tinyddp/kernels/cuda/cuda_kernels.h"

namespace tinyddp::kernels::cuda {
namespace {
constexpr Kernels kTable{
    .gemm = &gemm,
    .gemm_mixed = &gemm_mixed,
    .bias_add = &bias_add,
    .bias_grad = &bias_grad,
    .relu_forward = &relu_forward,
    .relu_backward = &relu_backward,
    .gelu_forward = &gelu_forward,
    .gelu_backward = &gelu_backward,
    .softmax_cross_entropy = &softmax_cross_entropy,
    .mse = &mse,
    .count_correct = &count_correct,
    .sgd_step = &sgd_step,
    .adam_step = &adam_step,
    .sum_of_squares = &sum_of_squares,
    .fill = &fill,
    .scale = &scale,
    .axpy = &axpy,
    .convert = &convert,
};
}  // namespace
}  // namespace tinyddp::kernels::cuda

extern "C" __attribute__((visibility("default"))) const tinyddp::kernels::cuda::Kernels* tinyddp_cuda_kernels(int abi) {
  return abi == tinyddp::kCudaPluginAbi ? &tinyddp::kernels::cuda::kTable : nullptr;
}
