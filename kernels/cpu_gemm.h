// Which library computes kernels::gemm on the CPU.
//
// One core's fp32 GEMM is the bound of an MLP training step, and the fastest library depends on the
// CPU: on cores with AVX-512, oneDNN's sgemm runs about twice as fast as OpenBLAS held to its AVX2
// (Haswell) kernels, which is what OpenBLAS runs where OPENBLAS_CORETYPE=Haswell is set because some
// of its builds miscompute on those CPUs; on AVX2-only cores OpenBLAS is the faster of the two
// (bench/train_results.md has the figures). So the choice is made at run time, once, from what the
// CPU can do:
//
//   TINYDDP_CPU_GEMM=onednn|openblas   set by the user: that one (an error if it cannot be had)
//   the CPU has AVX-512 (F, CD, BW, DQ, VL: oneDNN's avx512_core)   oneDNN, for products of at least
//                                                                    64x64x64 multiply-adds (smaller
//                                                                    ones are call-bound: OpenBLAS)
//   otherwise                                                        OpenBLAS
//
// OpenBLAS is always linked: it is the fallback, and `-DTINYDDP_ONEDNN=OFF` builds with it alone.
// oneDNN is loaded when first used (kernels/cpu_gemm_onednn.cpp), so a program that does not use it
// does not carry it (7 MB of peak RSS), and one on a machine without libdnnl2 still runs, on OpenBLAS.
// Asked for by name (the variable, set_cpu_gemm), a library computes every product.
// Both compute c = alpha op(a) op(b) + beta c on row-major f32 matrices; they round differently
// (other blockings of the same sums), within the tolerances the kernel tests hold against PyTorch.
#pragma once

#include <string>
#include <vector>

namespace tinyddp::kernels {

enum class CpuGemm { openblas, onednn };

// "OpenBLAS", "oneDNN".
const char* cpu_gemm_name(CpuGemm gemm);
// The libraries this build has and this machine can load, OpenBLAS first.
std::vector<CpuGemm> available_cpu_gemms();
// The one gemm() uses now (chosen on first use, as described above).
CpuGemm cpu_gemm();
// Why: "oneDNN 2.6.3 (this CPU has AVX-512)", "OpenBLAS 0.3.21 (TINYDDP_CPU_GEMM=openblas)", ...
std::string cpu_gemm_description();
// Uses `gemm` from now on, in every thread. Throws when it is not available (see above).
void set_cpu_gemm(CpuGemm gemm);

}  // namespace tinyddp::kernels
