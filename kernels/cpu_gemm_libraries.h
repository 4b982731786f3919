// The CPU GEMM libraries behind one signature each, for kernels/gemm.cpp and kernels/cpu_gemm.cpp.
// Internal to kernels/. Row-major; leading dimensions are each matrix's row length as stored.
#pragma once

#include <cstdint>
#include <string>

namespace tinyddp::kernels::detail {

// OpenBLAS (kernels/cpu_gemm_openblas.cpp), always built.
void openblas_sgemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                    int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
void openblas_set_threads(int threads);
std::string openblas_version();

#ifdef TINYDDP_WITH_ONEDNN
// oneDNN (kernels/cpu_gemm_onednn.cpp), built when TINYDDP_WITH_ONEDNN is defined.
void onednn_sgemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                  int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
void onednn_set_threads(int threads);
std::string onednn_version();
// True when oneDNN dispatches to AVX-512 kernels on this CPU (its avx512_core level or above).
bool onednn_has_avx512();
#endif

}  // namespace tinyddp::kernels::detail
