// f32 <-> bf16 and f32 <-> f16 on the GPU: a grid-stride loop around core/half_precision.h's element
// conversions, the same arithmetic the CPU loops and the collectives run.
#include "tinyddp/core/error.h"
#include "tinyddp/kernels/cuda/cuda_kernels.h"
#include "tinyddp/kernels/cuda/launch.cuh"

namespace tinyddp::kernels::cuda {

namespace {

using detail::first_index;
using detail::grid_stride;
using detail::kThreads;

// Every supported pair converts through f32: widening is exact, so To(float(x)) rounds once.
template <typename From, typename To>
__global__ void convert_kernel(const From* in, To* out, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) out[i] = To(float(in[i]));
}

template <typename From, typename To>
void launch_convert(const void* in, void* out, int64_t n) {
  convert_kernel<<<detail::blocks_for(n), kThreads>>>(static_cast<const From*>(in), static_cast<To*>(out), n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void convert(int device, const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n) {
  if (n == 0) return;
  detail::use_device(device);
  if (src_dtype == DType::f32 && dst_dtype == DType::bf16) return launch_convert<float, bfloat16>(src, dst, n);
  if (src_dtype == DType::bf16 && dst_dtype == DType::f32) return launch_convert<bfloat16, float>(src, dst, n);
  if (src_dtype == DType::f32 && dst_dtype == DType::f16) return launch_convert<float, float16>(src, dst, n);
  if (src_dtype == DType::f16 && dst_dtype == DType::f32) return launch_convert<float16, float>(src, dst, n);
  // kernels::convert checked the pair; the CUDA half links nothing of core's dtype names.
  TINYDDP_FAIL("convert on CUDA: dtype code ", int(src_dtype), " -> ", int(dst_dtype), " is not supported",
               hint("convert between f32 and bf16 or f16"));
}

}  // namespace tinyddp::kernels::cuda
