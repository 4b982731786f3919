// The element-wise passes of mixed precision (kernels/ops.h): rounding the GEMMs' operands to bf16
// or f16, alone or fused into the pass next to it, so that an operand costs one read of its f32
// values instead of one more pass over them.
//
// Every fused pass writes, bit for bit, what the unfused calls it replaces write: the same rounding
// (core/half_precision.h's round to nearest even, NaN kept quiet) and, for the bias gradient, the
// same sums in the same order as bias_grad (kernels/bias.cpp). The tests compare them.
#include <algorithm>
#include <type_traits>

#include "tinyddp/core/error.h"
#include "tinyddp/core/half_convert.h"
#include "tinyddp/kernels/argument_checks.h"
#include "tinyddp/kernels/cpu_column_sums.h"
#include "tinyddp/kernels/cpu_vector_clones.h"
#include "tinyddp/kernels/cuda_dispatch.h"
#include "tinyddp/kernels/ops.h"

namespace tinyddp::kernels {

namespace {

// The bf16 nearest to v, as an f32: core/half_precision.h's rounding and its exact widening, inline,
// so that the compiler turns its NaN test into a select and vectorises the loops below (the array
// conversions of core/half_convert.h would need a bf16 buffer between the two steps).
inline float bf16_rounded(float v) { return f32_from_bf16_bits(bf16_bits_from_f32(v)); }

TINYDDP_CPU_VECTOR_CLONES void round_bf16_loop(const float* __restrict in, float* __restrict out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = bf16_rounded(in[i]);
}

// Both forms of the rounded values from one read of `in`: the bf16 bits and their f32 widening.
TINYDDP_CPU_VECTOR_CLONES void round_bf16_both_loop(const float* __restrict in, bfloat16* __restrict narrow,
                                                    float* __restrict wide, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const uint16_t bits = bf16_bits_from_f32(in[i]);
    narrow[i].bits = bits;
    wide[i] = f32_from_bf16_bits(bits);
  }
}

// f16 (or anything else) the long way: through the 16-bit type a block at a time (core/half_convert.h:
// F16C where the CPU has it).
template <typename Narrow>
void round_through(const float* src, float* dst, size_t n) {
  constexpr size_t kBlock = 1024;
  Narrow block[kBlock];
  for (size_t begin = 0; begin < n; begin += kBlock) {
    const size_t count = std::min(kBlock, n - begin);
    round_from_f32(src + begin, block, count);
    widen_to_f32(block, dst + begin, count);
  }
}

// bias_grad's column sums (kernels/cpu_column_sums.h, the same additions in the same order), each dy
// row's bf16 rounding written while the row is in L1. Out is f32 (the rounded values) or bf16 (their
// bits). Not given an AVX2 clone: bias_grad, whose loop this is, has none either (a clone would not
// reach the shared loop inside), and one pass over dy is memory-bound at any vector width.
template <typename Out>
TINYDDP_CPU_VECTOR_CLONES void bias_grad_round_bf16_loop(const float* in, float* dbias, float beta, Out* rounded,
                                                         int64_t rows, int64_t cols) {
  detail::cpu_column_sums(in, dbias, beta, rows, cols,
                          [&](const float* __restrict row, int64_t i, int64_t j0, int64_t width) {
                            Out* __restrict out = rounded + i * cols + j0;
                            for (int64_t j = 0; j < width; ++j) {
                              if constexpr (std::is_same_v<Out, float>)
                                out[j] = bf16_rounded(row[j]);
                              else
                                out[j].bits = bf16_bits_from_f32(row[j]);
                            }
                          });
}

void check_narrow(const char* op, DType narrow) {
  TINYDDP_CHECK(narrow == DType::bf16 || narrow == DType::f16, op, ": ", dtype_name(narrow), " is not a narrow type",
                hint("round to bf16 or f16"));
}

// `dst` may hold `narrow` values in `narrow` itself or in f32, as mixed_operand_dtype says.
void check_rounded_like(const char* op, const char* arg, const Tensor& src, DType narrow, const Tensor& dst) {
  TINYDDP_CHECK(dst.defined() && (dst.dtype() == narrow || dst.dtype() == DType::f32), op, ": `", arg, "` is ",
                dst.describe(), " but must be ", dtype_name(narrow), " or f32",
                hint("allocate it with mixed_operand_dtype"));
  TINYDDP_CHECK(src.numel() == dst.numel() && src.device() == dst.device(), op, ": `", arg, "` is ", dst.describe(),
                " but the values it rounds are ", src.describe(),
                hint("the same number of elements, on the same device"));
}

}  // namespace

void round_to(const Tensor& src, DType narrow, Tensor& dst) {
  constexpr const char* op = "round_to";
  check_narrow(op, narrow);
  TINYDDP_CHECK(src.defined() && src.dtype() == DType::f32, op, ": `src` is ", src.describe(), " but must be f32");
  check_rounded_like(op, "dst", src, narrow, dst);
  if (dst.dtype() == narrow) return convert(src, dst);
  if (cuda_kernels_for(src)) {  // f32 holding rounded values on a GPU: there and back
    Tensor narrow_copy = Tensor::empty(src.shape(), narrow, src.device());
    convert(src, narrow_copy);
    return convert(narrow_copy, dst);
  }
  const size_t n = size_t(src.numel());
  if (narrow == DType::bf16)
    round_bf16_loop(src.data<float>(), dst.data<float>(), n);
  else
    round_through<float16>(src.data<float>(), dst.data<float>(), n);
}

void round_to_both(const Tensor& src, DType narrow, Tensor& narrow_dst, Tensor& f32_dst) {
  constexpr const char* op = "round_to_both";
  check_narrow(op, narrow);
  TINYDDP_CHECK(src.defined() && src.dtype() == DType::f32, op, ": `src` is ", src.describe(), " but must be f32");
  TINYDDP_CHECK(narrow_dst.defined() && narrow_dst.dtype() == narrow, op, ": `narrow_dst` is ", narrow_dst.describe(),
                " but must be ", dtype_name(narrow));
  TINYDDP_CHECK(f32_dst.defined() && f32_dst.dtype() == DType::f32, op, ": `f32_dst` is ", f32_dst.describe(),
                " but must be f32");
  check_rounded_like(op, "narrow_dst", src, narrow, narrow_dst);
  check_rounded_like(op, "f32_dst", src, narrow, f32_dst);
  if (narrow == DType::bf16 && !cuda_kernels_for(src)) {
    round_bf16_both_loop(src.data<float>(), narrow_dst.data<bfloat16>(), f32_dst.data<float>(), size_t(src.numel()));
    return;
  }
  convert(src, narrow_dst);      // f16 (F16C rounds faster than it could be fused), and GPUs
  convert(narrow_dst, f32_dst);  // widening is exact
}

void bias_grad_and_round(const Tensor& dy, Tensor& dbias, float beta, DType narrow, Tensor& dy_rounded) {
  constexpr const char* op = "bias_grad_and_round";
  check_narrow(op, narrow);
  detail::check_tensor(op, "dy", dy);
  check_rounded_like(op, "dy_rounded", dy, narrow, dy_rounded);
  if (narrow != DType::bf16 || cuda_kernels_for(dy)) {  // two passes: f16 on CPUs, and GPUs
    bias_grad(dy, dbias, beta);
    return round_to(dy, narrow, dy_rounded);
  }
  TINYDDP_CHECK(dy.dim() == 2, op, ": `dy` is ", dy.describe(), " but must be 2-D", hint("[rows, columns]"));
  TINYDDP_CHECK(dbias.defined() && dbias.dtype() == DType::f32 && dbias.dim() == 1 && dbias.size(0) == dy.size(1) &&
                    dbias.device() == dy.device(),
                op, ": `dbias` is ", dbias.describe(), " but `dy` is ", dy.describe(),
                hint("an f32 bias gradient with one entry per column (", dy.size(1), "), on dy's device"));
  if (dy.size(1) == 0) return;
  if (dy_rounded.dtype() == DType::f32)
    bias_grad_round_bf16_loop(dy.data<float>(), dbias.data<float>(), beta, dy_rounded.data<float>(), dy.size(0),
                              dy.size(1));
  else
    bias_grad_round_bf16_loop(dy.data<float>(), dbias.data<float>(), beta, dy_rounded.data<bfloat16>(), dy.size(0),
                              dy.size(1));
}

}  // namespace tinyddp::kernels
