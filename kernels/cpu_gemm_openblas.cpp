// kernels::gemm on the CPU through OpenBLAS's CBLAS interface: the fallback that every build has.
#include <cblas.h>

#include <algorithm>
#include <cctype>
#include <set>

#include "tinyddp/kernels/cpu_gemm_libraries.h"

namespace tinyddp::kernels::detail {

void openblas_sgemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                    int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  // CBLAS indexes with int: gemm() has checked that every dimension fits.
  cblas_sgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans, transpose_b ? CblasTrans : CblasNoTrans, int(m),
              int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
}

void openblas_set_threads(int threads) { openblas_set_num_threads(threads); }

std::string openblas_version() {
  // openblas_get_config() is "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ...": its first two words, then
  // the kernel family it runs on this CPU (which OPENBLAS_CORETYPE can override).
  std::string config = openblas_get_config();
  size_t second_space = config.find(' ', config.find(' ') + 1);
  return config.substr(0, second_space) + ", " + openblas_get_corename() + " kernels";
}

std::string openblas_core_name() { return openblas_get_corename(); }

VectorClass openblas_vector_class() {
  // OpenBLAS's x86 kernel families by the vectors their sgemm uses; every family not named here (the
  // generic Prescott, Nehalem, Sandybridge, ...) is narrower than AVX2.
  static const std::set<std::string> avx512{"skylakex", "cooperlake", "sapphirerapids"};
  static const std::set<std::string> avx2{"haswell", "zen", "excavator", "steamroller"};
  std::string core = openblas_core_name();
  std::transform(core.begin(), core.end(), core.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  if (avx512.count(core)) return VectorClass::avx512;
  if (avx2.count(core)) return VectorClass::avx2;
  return VectorClass::narrower;
}

}  // namespace tinyddp::kernels::detail
