// The mixed-precision GEMM's choice of units and its operands' rounding (kernels/mixed_gemm.h).
#include "tinyddp/kernels/mixed_gemm.h"

#include <algorithm>
#include <mutex>

#include "tinyddp/core/error.h"
#include "tinyddp/core/half_convert.h"
#include "tinyddp/kernels/cpu_gemm.h"
#include "tinyddp/kernels/cpu_gemm_libraries.h"
#include "tinyddp/kernels/cuda_dispatch.h"
#include "tinyddp/kernels/ops.h"

namespace tinyddp::kernels {

namespace {

const char* narrow_name(DType narrow) { return narrow == DType::bf16 ? "bf16" : "f16"; }

MixedGemmChoice rounded(DType narrow, const std::string& why, const MixedGemmFacts& facts) {
  return {MixedGemmPath::rounded_f32, why + ": operands rounded to " + narrow_name(narrow) +
                                          ", their products summed by the f32 GEMM, " + facts.f32_gemm};
}

MixedGemmFacts gather_facts() {
  MixedGemmFacts facts;
  facts.cpu_has_avx512_core = detail::cpu_has_avx512_core();
  facts.f32_gemm = cpu_gemm_description();
#ifdef TINYDDP_WITH_ONEDNN
  // Only a CPU with AVX-512 can have bf16 units: elsewhere oneDNN is not loaded just to ask.
  if (facts.cpu_has_avx512_core && detail::onednn_loadable()) {
    facts.onednn_isa = detail::onednn_isa_name();
    facts.onednn_bf16_matmul = detail::onednn_bf16_matmul_available(&facts.why_no_matmul);
  }
#endif
  return facts;
}

// f32 -> bf16 or f16 -> f32, a block at a time through core/half_convert.h: one rounding for the
// GEMM's operands and the collectives' narrow wire formats, in the fastest form this CPU has.
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

}  // namespace

MixedGemmChoice choose_cpu_mixed_gemm(DType narrow, const MixedGemmFacts& facts) {
  TINYDDP_CHECK(narrow == DType::bf16 || narrow == DType::f16, "mixed-precision GEMM: ", dtype_name(narrow),
                " is not a narrow operand type", hint("use bf16 or f16"));
  if (narrow == DType::f16) return rounded(narrow, "oneDNN 2.6 has no f16 GEMM for CPUs", facts);
  if (!facts.cpu_has_avx512_core) return rounded(narrow, "no bf16 units on this CPU (it has no AVX-512)", facts);
  if (facts.onednn_isa.empty()) return rounded(narrow, "oneDNN is not available to run bf16", facts);
  const bool amx = facts.onednn_isa == "avx512_core_amx";
  if (!amx && facts.onednn_isa != "avx512_core_bf16")
    return rounded(narrow,
                   "no bf16 units that oneDNN runs here (it runs " + facts.onednn_isa +
                       "; on AVX-512 without BF16 its emulated bf16 is slower than its f32 GEMM)",
                   facts);
  if (!facts.onednn_bf16_matmul) return rounded(narrow, facts.why_no_matmul, facts);
  return {MixedGemmPath::onednn_bf16, std::string("oneDNN's bf16 matmul on ") +
                                          (amx ? "AMX tiles" : "AVX512-BF16 (vdpbf16ps)") + " (oneDNN runs " +
                                          facts.onednn_isa + "), products summed in f32"};
}

const MixedGemmChoice& cpu_mixed_gemm(DType narrow) {
  static std::once_flag once;
  static MixedGemmChoice bf16, f16;
  std::call_once(once, [] {
    const MixedGemmFacts facts = gather_facts();
    bf16 = choose_cpu_mixed_gemm(DType::bf16, facts);
    f16 = choose_cpu_mixed_gemm(DType::f16, facts);
  });
  TINYDDP_CHECK(narrow == DType::bf16 || narrow == DType::f16, "mixed-precision GEMM: ", dtype_name(narrow),
                " is not a narrow operand type", hint("use bf16 or f16"));
  return narrow == DType::bf16 ? bf16 : f16;
}

DType mixed_operand_dtype(DType narrow, Device device) {
  TINYDDP_CHECK(narrow == DType::bf16 || narrow == DType::f16, "mixed_operand_dtype: ", dtype_name(narrow),
                " is not a narrow operand type", hint("use bf16 or f16"));
  if (device.is_cuda()) return narrow;  // tensor cores (and the fake devices, whose CPU loops widen them)
  return cpu_mixed_gemm(narrow).path == MixedGemmPath::onednn_bf16 ? narrow : DType::f32;
}

std::string mixed_gemm_units(DType narrow, Device device) {
  if (device.is_cuda())
    return std::string("cuBLAS on ") + device.str() + ", " + (narrow == DType::bf16 ? "CUDA_R_16BF" : "CUDA_R_16F") +
           " operands, CUBLAS_COMPUTE_32F (tensor cores)";
  return cpu_mixed_gemm(narrow).units;
}

void round_to(const Tensor& src, DType narrow, Tensor& dst) {
  constexpr const char* op = "round_to";
  TINYDDP_CHECK(narrow == DType::bf16 || narrow == DType::f16, op, ": ", dtype_name(narrow), " is not a narrow type",
                hint("round to bf16 or f16"));
  TINYDDP_CHECK(src.defined() && src.dtype() == DType::f32, op, ": `src` is ", src.describe(), " but must be f32");
  TINYDDP_CHECK(dst.defined() && (dst.dtype() == narrow || dst.dtype() == DType::f32), op, ": `dst` is ",
                dst.describe(), " but must be ", dtype_name(narrow), " or f32",
                hint("allocate it with mixed_operand_dtype"));
  TINYDDP_CHECK(src.numel() == dst.numel() && src.device() == dst.device(), op, ": `src` is ", src.describe(),
                " but `dst` is ", dst.describe(), hint("the same number of elements, on the same device"));
  if (dst.dtype() == narrow) return convert(src, dst);
  if (cuda_kernels_for(src)) {  // f32 holding rounded values on a GPU: there and back
    Tensor narrow_copy = Tensor::empty(src.shape(), narrow, src.device());
    convert(src, narrow_copy);
    return convert(narrow_copy, dst);
  }
  const size_t n = size_t(src.numel());
  if (narrow == DType::bf16)
    round_through<bfloat16>(src.data<float>(), dst.data<float>(), n);
  else
    round_through<float16>(src.data<float>(), dst.data<float>(), n);
}

}  // namespace tinyddp::kernels
