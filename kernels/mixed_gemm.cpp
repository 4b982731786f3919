// The mixed-precision GEMM's choice of units and its operands' rounding (kernels/mixed_gemm.h).
#include "tinyddp/kernels/mixed_gemm.h"

#include <algorithm>
#include <mutex>

#include "tinyddp/core/error.h"
#include "tinyddp/kernels/cpu_gemm.h"
#include "tinyddp/kernels/cpu_gemm_libraries.h"
#include "tinyddp/kernels/cuda_dispatch.h"
#include "tinyddp/kernels/ops.h"

namespace tinyddp::kernels {

namespace {

const char* narrow_name(DType narrow) { return narrow == DType::bf16 ? "bf16" : "f16"; }

// Said plainly, because nothing else would tell a user who chose the mixed precision for speed: on
// this path it computes the fp32 GEMM's work plus the rounding passes, so it cannot be faster.
MixedGemmChoice rounded(DType narrow, const std::string& why, const MixedGemmFacts& facts) {
  return {MixedGemmPath::rounded_f32,
          why + ": operands rounded to " + narrow_name(narrow) + ", their products summed by the f32 GEMM, " +
              facts.f32_gemm + ". On this CPU fp32 is faster: it does the same GEMMs without the " +
              "rounding passes (" + narrow_name(narrow) + " here gives the mixed precision's numbers, not speed)"};
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

}  // namespace tinyddp::kernels
