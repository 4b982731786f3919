// The CPU GEMM libraries behind one signature each, for kernels/gemm.cpp and kernels/cpu_gemm.cpp.
// Internal to kernels/. Row-major; leading dimensions are each matrix's row length as stored.
#pragma once

#include <cstdint>
#include <string>

namespace tinyddp::kernels::detail {

// True when the CPU runs AVX-512 at the level of oneDNN's avx512_core (F, CD, BW, DQ, VL), with the OS
// saving its registers.
bool cpu_has_avx512_core();

// The widest vectors a library's kernels use here, as it reports them: the terms of the choice in
// kernels/cpu_gemm.cpp. Ordered: a wider class is the faster at the same clock.
enum class VectorClass { narrower = 0, avx2 = 1, avx512 = 2 };
const char* vector_class_name(VectorClass vectors);
// Whether gemm() computes an m x n x k product with oneDNN: the choice is oneDNN, the product is
// large enough for it (kernels/cpu_gemm.cpp), and the library loads (else the choice becomes OpenBLAS).
bool use_onednn_for(int64_t m, int64_t n, int64_t k);

// OpenBLAS (kernels/cpu_gemm_openblas.cpp), always built.
void openblas_sgemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                    int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
void openblas_set_threads(int threads);
std::string openblas_version();
// The kernel family OpenBLAS runs ("Haswell", "SkylakeX", "Prescott" where it does not know the CPU, or
// what OPENBLAS_CORETYPE forces), and the vectors that family uses.
std::string openblas_core_name();
VectorClass openblas_vector_class();

#ifdef TINYDDP_WITH_ONEDNN
// oneDNN (kernels/cpu_gemm_onednn.cpp), built when TINYDDP_WITH_ONEDNN is defined and loaded on first
// use. onednn_loadable loads it if it is not yet, and says why it cannot be when it cannot.
bool onednn_loadable(std::string* why_not = nullptr);
void onednn_sgemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                  int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
void onednn_set_threads(int threads);
// Applies set_cpu_threads' count to the calling thread's OpenMP, as onednn_sgemm does before it runs:
// for the other oneDNN calls (kernels/cpu_gemm_onednn_bf16.cpp).
void onednn_apply_threads();
// The dlopen handle of the loaded libdnnl, for looking up the other functions it is used for; null when
// it is not loadable.
void* onednn_library();
std::string onednn_version();
// The instruction set oneDNN's kernels use here (dnnl_get_effective_cpu_isa: the CPU's best, or less
// where ONEDNN_MAX_CPU_ISA caps it), by oneDNN's name ("avx512_core_amx", "avx2", ...), and its vectors.
// Only once onednn_loadable().
std::string onednn_isa_name();
VectorClass onednn_vector_class();

// oneDNN's matmul primitive with bf16 operands and an f32 result (kernels/cpu_gemm_onednn_bf16.cpp):
// c = alpha op(a) op(b) + beta c, row-major, the bf16 values as their bits. Available when oneDNN
// loads and implements that matmul on this CPU (2.6 does from avx512_core up; not on AVX2); the
// first call asks it, and says why not when it is not.
bool onednn_bf16_matmul_available(std::string* why_not = nullptr);
void onednn_bf16_gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
                      const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta, float* c,
                      int64_t ldc);
#endif

}  // namespace tinyddp::kernels::detail
