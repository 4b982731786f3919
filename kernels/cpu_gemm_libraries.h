// The CPU GEMM libraries behind one signature each, for kernels/gemm.cpp and kernels/cpu_gemm.cpp.
// Internal to kernels/. Row-major; leading dimensions are each matrix's row length as stored.
#pragma once

#include <cstdint>
#include <string>

namespace tinyddp::kernels::detail {

// True when the CPU runs AVX-512 at the level of oneDNN's avx512_core (F, CD, BW, DQ, VL), with the OS
// saving its registers: where oneDNN's kernels are the faster (kernels/cpu_gemm.h).
bool cpu_has_avx512_core();
// Whether gemm() computes an m x n x k product with oneDNN: the choice is oneDNN, the product is
// large enough for it (kernels/cpu_gemm.cpp), and the library loads (else the choice becomes OpenBLAS).
bool use_onednn_for(int64_t m, int64_t n, int64_t k);

// OpenBLAS (kernels/cpu_gemm_openblas.cpp), always built.
void openblas_sgemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                    int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
void openblas_set_threads(int threads);
std::string openblas_version();

#ifdef TINYDDP_WITH_ONEDNN
// oneDNN (kernels/cpu_gemm_onednn.cpp), built when TINYDDP_WITH_ONEDNN is defined and loaded on first
// use. onednn_loadable loads it if it is not yet, and says why it cannot be when it cannot.
bool onednn_loadable(std::string* why_not = nullptr);
void onednn_sgemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                  int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
void onednn_set_threads(int threads);
std::string onednn_version();
#endif

}  // namespace tinyddp::kernels::detail
