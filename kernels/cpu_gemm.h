// Which library computes kernels::gemm on the CPU.
//
// One core's fp32 GEMM is the bound of an MLP training step, and the fastest library depends on the
// CPU and on which kernels each library runs on it. A CPU's flags alone do not say that: an OpenBLAS
// older than the CPU falls back to its generic kernel (Debian 12's 0.3.21 runs "Prescott" on a Sapphire
// Rapids Xeon, at a fifth of oneDNN's rate), and ONEDNN_MAX_CPU_ISA / OPENBLAS_CORETYPE cap either
// library below the CPU. So the choice is made at run time, once, from what the libraries report:
//
//   TINYDDP_CPU_GEMM=onednn|openblas       set by the user: that one (an error if it cannot be had)
//   oneDNN runs AVX-512 kernels            oneDNN: on AVX-512 its sgemm outruns OpenBLAS's, whichever
//                                          kernel OpenBLAS runs (docs/results.md)
//   oneDNN runs wider vectors than         oneDNN (OpenBLAS fell back to a narrower kernel)
//     OpenBLAS's kernel family
//   otherwise                              OpenBLAS: at the same width (AVX2) it is the faster
//
// OpenBLAS reports its kernel family (openblas_get_corename) without cost. oneDNN must be loaded to
// report its ISA, and loading it costs 7 MB of peak RSS, so when the CPU could make oneDNN the choice
// it is loaded at the first product of at least 64x64x64 multiply-adds; smaller products are
// call-bound and stay on OpenBLAS, and a program whose products are all that small -- the seed job's
// Linear(10, 2) -- never loads it. On a machine without libdnnl2 the program runs on, on OpenBLAS.
// Asked for by name (the variable, set_cpu_gemm), a library computes every product.
// `TINYDDP_DEBUG=INFO` logs the choice and why; gemm_bench and train_bench print it.
// Both compute c = alpha op(a) op(b) + beta c on row-major f32 matrices; they round differently
// (other blockings of the same sums), within the tolerances the kernel tests derive.
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
// The library and why: "oneDNN 2.6.3 (oneDNN runs avx512_core_amx kernels here, OpenBLAS Prescott ...)", ...
std::string cpu_gemm_description();
// What each library runs on this CPU, as it reports it: "oneDNN runs avx512_core_amx kernels here,
// OpenBLAS runs its Prescott kernels" (loads oneDNN to ask it). The terms of the choice above.
std::string cpu_gemm_kernels();
// Uses `gemm` from now on, in every thread. Throws when it is not available (see above).
void set_cpu_gemm(CpuGemm gemm);

}  // namespace tinyddp::kernels
