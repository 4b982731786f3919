// Which units compute a GEMM whose operands are bf16 or f16 (mixed precision, nn/precision), and in
// which dtype its operands are kept.
//
// Every product of two bf16 numbers (8-bit significands) or two f16 numbers (11-bit) is exact in f32
// (24-bit), so "narrow operands, f32 accumulation" can be computed two ways with the same products:
//
//   narrow units   the hardware multiplies the narrow values and sums in f32: AMX tiles and
//                  AVX512-BF16's vdpbf16ps (oneDNN's bf16 matmul), a GPU's tensor cores (cuBLAS with
//                  CUDA_R_16BF / CUDA_R_16F and CUBLAS_COMPUTE_32F). Operands are stored narrow:
//                  half the bytes to read.
//   rounded f32    on CPUs without such units (AVX2 hosts; AVX-512 without BF16, where oneDNN would
//                  emulate bf16 slower than its f32 GEMM): the operands are rounded to the narrow type
//                  but kept as f32, and the f32 GEMM (kernels/cpu_gemm.h) multiplies them. Same
//                  products; the sums differ only in order, as between any two f32 GEMMs.
//
// f16 has no CPU units oneDNN 2.6 uses, so on CPUs it always takes the rounded f32 path. The choice is
// made once per process (and dtype) from what oneDNN reports, so ONEDNN_MAX_CPU_ISA caps it as it
// caps the f32 GEMM; `choose_cpu_mixed_gemm` is that choice as a function of the facts, for tests.
#pragma once

#include <string>

#include "tinyddp/core/dtype.h"

namespace tinyddp::kernels {

enum class MixedGemmPath { onednn_bf16, rounded_f32 };

struct MixedGemmChoice {
  MixedGemmPath path = MixedGemmPath::rounded_f32;
  std::string units{};  // which units run it, and why, in words
};

// What the CPU and oneDNN report, the terms of the choice.
struct MixedGemmFacts {
  bool cpu_has_avx512_core = false;  // without it no x86 CPU has bf16 units, and oneDNN is not loaded to ask
  std::string onednn_isa{};          // oneDNN's effective ISA ("avx512_core_amx"); empty: not loaded or absent
  bool onednn_bf16_matmul = false;   // oneDNN implements the bf16 matmul here
  std::string why_no_matmul{};       // when it does not
  std::string f32_gemm{};            // the f32 GEMM the rounded path uses ("OpenBLAS 0.3.21 ...")
};

// narrow: bf16 or f16.
MixedGemmChoice choose_cpu_mixed_gemm(DType narrow, const MixedGemmFacts& facts);
// This process's choice for `narrow` (gathers the facts the first time, loading oneDNN if the CPU has
// AVX-512).
const MixedGemmChoice& cpu_mixed_gemm(DType narrow);

}  // namespace tinyddp::kernels
