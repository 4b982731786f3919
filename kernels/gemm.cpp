// GEMM, the one kernel that does almost all the arithmetic of an MLP: Linear's forward is
// y = x @ W^T, its backward dx = dy @ W and dW = dy^T @ x. All three are one call with different
// transpose flags, so no tensor is ever transposed in memory.
//
// CPU: the machine's best GEMM library, oneDNN or OpenBLAS (kernels/cpu_gemm.h), row-major.
// CUDA: cublasSgemm (kernels/cuda/gemm.cpp).
// bf16 or f16 operands (mixed precision): the units kernels/mixed_gemm.h chooses, or, for narrow
// operands where that is the f32 GEMM, the operands widened (exactly) into f32 first.
#include <climits>
#include <utility>

#include "tinyddp/kernels/argument_checks.h"
#include "tinyddp/kernels/cpu_gemm_libraries.h"
#include "tinyddp/kernels/mixed_gemm.h"
#include "tinyddp/kernels/ops.h"

#include "tinyddp/kernels/cuda_dispatch.h"

namespace tinyddp::kernels {

void gemm(const Tensor& a, bool transpose_a, const Tensor& b, bool transpose_b, Tensor& c, float alpha, float beta) {
  constexpr const char* op = "gemm";
  const DType operands = a.defined() ? a.dtype() : DType::f32;
  const bool narrow = operands == DType::bf16 || operands == DType::f16;
  detail::check_tensor(op, "a", a, narrow ? operands : DType::f32);
  TINYDDP_CHECK(b.defined() && b.dtype() == operands, op, ": `a` is ", a.describe(), " but `b` is ", b.describe(),
                hint("both operands f32, or both rounded to one narrow type (kernels::round_to)"));
  detail::check_tensor(op, "c", c);
  detail::check_dim(op, "a", a, 2);
  detail::check_dim(op, "b", b, 2);
  detail::check_dim(op, "c", c, 2);
  detail::check_same_device(op, "a", a, "b", b);
  detail::check_same_device(op, "a", a, "c", c);
  // op(a) is [m, k], op(b) is [k, n], c is [m, n].
  const int64_t m = transpose_a ? a.size(1) : a.size(0);
  const int64_t k = transpose_a ? a.size(0) : a.size(1);
  const int64_t k_b = transpose_b ? b.size(1) : b.size(0);
  const int64_t n = transpose_b ? b.size(0) : b.size(1);
  TINYDDP_CHECK(k == k_b, "gemm: inner dimensions differ: op(a) is [", m, ", ", k, "] (a is ", a.describe(),
                transpose_a ? ", transposed" : "", ") but op(b) is [", k_b, ", ", n, "] (b is ", b.describe(),
                transpose_b ? ", transposed" : "", ")", hint("check the transpose flags and the operand order"));
  TINYDDP_CHECK(c.size(0) == m && c.size(1) == n, "gemm: the result op(a) @ op(b) is [", m, ", ", n, "] but `c` is ",
                c.describe(), hint("allocate c as [", m, ", ", n, "]"));
  TINYDDP_CHECK(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX, "gemm: dimensions [", m, ", ", n, ", ", k,
                "] exceed what BLAS libraries index with 32-bit integers", hint("split the product into row blocks"));
  // BLAS reads a and b while it writes c: c overlapping either would read half-updated values.
  for (const auto& [name, operand] : {std::pair<const char*, const Tensor*>{"a", &a}, {"b", &b}}) {
    const bool overlap = c.shares_storage_with(*operand) && c.offset() < operand->offset() + operand->numel() &&
                         operand->offset() < c.offset() + c.numel();
    TINYDDP_CHECK(!overlap, "gemm: the output `c` overlaps the memory of `", name, "`",
                  hint("write the product into a ", "separate tensor and copy it back"));
  }
  if (m == 0 || n == 0) return;
  if (k == 0) {  // an empty sum: c = beta * c, which BLAS libraries do not all agree on for k = 0
    if (beta == 0.f)
      fill(c, 0.f);
    else
      scale(c, beta);
    return;
  }
  // Row-major storage: each matrix's leading dimension is its row length as stored.
  const int64_t lda = a.size(1), ldb = b.size(1), ldc = c.size(1);
  if (narrow) {
    if (const cuda::Kernels* gpu = cuda_kernels_for(c)) {
      gpu->gemm_mixed(c.device().index, transpose_a, transpose_b, m, n, k, alpha, a.raw_data(), lda, b.raw_data(), ldb,
                      operands, beta, c.data<float>(), ldc);
      return;
    }
#ifdef TINYDDP_WITH_ONEDNN
    if (operands == DType::bf16 && cpu_mixed_gemm(DType::bf16).path == MixedGemmPath::onednn_bf16) {
      detail::onednn_bf16_gemm(transpose_a, transpose_b, m, n, k, alpha, static_cast<const uint16_t*>(a.raw_data()),
                               lda, static_cast<const uint16_t*>(b.raw_data()), ldb, beta, c.data<float>(), ldc);
      return;
    }
#endif
    // Every narrow value is an f32, so widening changes nothing: the f32 GEMM computes the same products.
    Tensor wide_a = Tensor::empty(a.shape(), DType::f32, a.device()),
           wide_b = Tensor::empty(b.shape(), DType::f32, b.device());
    convert(a, wide_a);
    convert(b, wide_b);
    return gemm(wide_a, transpose_a, wide_b, transpose_b, c, alpha, beta);
  }
  if (const cuda::Kernels* gpu = cuda_kernels_for(c)) {
    gpu->gemm(c.device().index, transpose_a, transpose_b, m, n, k, alpha, a.data<float>(), lda, b.data<float>(), ldb,
              beta, c.data<float>(), ldc);
    return;
  }
#ifdef TINYDDP_WITH_ONEDNN
  if (detail::use_onednn_for(m, n, k)) {
    detail::onednn_sgemm(transpose_a, transpose_b, m, n, k, alpha, a.data<float>(), lda, b.data<float>(), ldb, beta,
                         c.data<float>(), ldc);
    return;
  }
#endif
  detail::openblas_sgemm(transpose_a, transpose_b, m, n, k, alpha, a.data<float>(), lda, b.data<float>(), ldb, beta,
                         c.data<float>(), ldc);
}

}  // namespace tinyddp::kernels
