// Converting a tensor's elements into another tensor of another floating dtype (kernels/ops.h).
#include "tinyddp/core/half_convert.h"
#include "tinyddp/kernels/cuda_dispatch.h"
#include "tinyddp/kernels/ops.h"

namespace tinyddp::kernels {

namespace {

bool is_supported_pair(DType from, DType to) {
  const bool narrow = from == DType::f32 && (to == DType::bf16 || to == DType::f16);
  const bool widen = to == DType::f32 && (from == DType::bf16 || from == DType::f16);
  return narrow || widen;
}

void convert_on_cpu(const Tensor& src, Tensor& dst) {
  const size_t n = size_t(src.numel());
  const DType from = src.dtype(), to = dst.dtype();
  if (from == DType::f32 && to == DType::bf16) return convert_f32_to_bf16(src.data<float>(), dst.data<bfloat16>(), n);
  if (from == DType::bf16 && to == DType::f32) return convert_bf16_to_f32(src.data<bfloat16>(), dst.data<float>(), n);
  if (from == DType::f32 && to == DType::f16) return convert_f32_to_f16(src.data<float>(), dst.data<float16>(), n);
  return convert_f16_to_f32(src.data<float16>(), dst.data<float>(), n);
}

}  // namespace

void convert(const Tensor& src, Tensor& dst) {
  constexpr const char* op = "convert";
  TINYDDP_CHECK(src.defined() && dst.defined(), op, ": argument `", src.defined() ? "dst" : "src",
                "` is an undefined tensor", hint("allocate it with Tensor::empty first"));
  TINYDDP_CHECK(src.numel() == dst.numel(), op, ": `src` is ", src.describe(), " but `dst` is ", dst.describe(),
                hint("they must hold the same number of elements"));
  TINYDDP_CHECK(src.device() == dst.device(), op, ": `src` is on ", src.device().str(), " but `dst` is on ",
                dst.device().str(), hint("move both to one device with .to(device)"));
  if (src.dtype() == dst.dtype()) return dst.copy_from(src);
  TINYDDP_CHECK(is_supported_pair(src.dtype(), dst.dtype()), op, ": ", dtype_name(src.dtype()), " -> ",
                dtype_name(dst.dtype()), " is not supported",
                hint("convert between f32 and bf16 or f16 ", "(Tensor::to converts between any two dtypes)"));
  if (src.numel() == 0) return;
  if (const cuda::Kernels* gpu = cuda_kernels_for(src)) {
    gpu->convert(src.device().index, src.raw_data(), src.dtype(), dst.raw_data(), dst.dtype(), src.numel());
    return;
  }
  convert_on_cpu(src, dst);
}

}  // namespace tinyddp::kernels
