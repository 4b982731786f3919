// The vector operations of BLAS level 1 that training needs: fill (zeroing or constant init),
// scale (dividing a gradient by the world size, clipping) and axpy (y += alpha x: accumulating).
#include "kernels/argument_checks.h"
#include "kernels/elementwise.h"
#include "kernels/ops.h"

#ifdef TINYDDP_WITH_CUDA
#include "kernels/cuda/cuda_kernels.h"
#endif

namespace tinyddp::kernels {

void fill(Tensor& x, float value) {
  constexpr const char* op = "fill";
  detail::check_tensor(op, "x", x);
  const int64_t n = x.numel();
  if (n == 0) return;
  if (x.device().is_cuda()) {
#ifdef TINYDDP_WITH_CUDA
    cuda::fill(x.device().index, x.data<float>(), n, value);
    return;
#else
    detail::cuda_not_built(op);
#endif
  }
  float* __restrict p = x.data<float>();
  for (int64_t i = 0; i < n; ++i) p[i] = value;
}

void scale(Tensor& x, float alpha) {
  constexpr const char* op = "scale";
  detail::check_tensor(op, "x", x);
  const int64_t n = x.numel();
  if (n == 0) return;
  if (x.device().is_cuda()) {
#ifdef TINYDDP_WITH_CUDA
    cuda::scale(x.device().index, x.data<float>(), n, alpha);
    return;
#else
    detail::cuda_not_built(op);
#endif
  }
  float* __restrict p = x.data<float>();
  for (int64_t i = 0; i < n; ++i) p[i] = scale_element(alpha, p[i]);
}

void axpy(float alpha, const Tensor& x, Tensor& y) {
  constexpr const char* op = "axpy";
  detail::check_tensor(op, "x", x);
  detail::check_tensor(op, "y", y);
  detail::check_like(op, "x", x, "y", y);
  const int64_t n = x.numel();
  if (n == 0) return;
  if (x.device().is_cuda()) {
#ifdef TINYDDP_WITH_CUDA
    cuda::axpy(x.device().index, alpha, x.data<float>(), y.data<float>(), n);
    return;
#else
    detail::cuda_not_built(op);
#endif
  }
  // x and y may be the same tensor (y += alpha y): element-wise, so no restrict on them.
  const float* px = x.data<float>();
  float* py = y.data<float>();
  for (int64_t i = 0; i < n; ++i) py[i] = axpy_element(alpha, px[i], py[i]);
}

}  // namespace tinyddp::kernels
