// The vector operations of BLAS level 1 that training needs: fill (zeroing or constant init),
// scale (dividing a gradient by the world size, clipping) and axpy (y += alpha x: accumulating).
#include "tinyddp/kernels/argument_checks.h"
#include "tinyddp/kernels/elementwise.h"
#include "tinyddp/kernels/ops.h"

#include "tinyddp/kernels/cuda_dispatch.h"

namespace tinyddp::kernels {

void fill(Tensor& x, float value) {
  constexpr const char* op = "fill";
  detail::check_tensor(op, "x", x);
  const int64_t n = x.numel();
  if (n == 0) return;
  if (const cuda::Kernels* gpu = cuda_kernels_for(x)) {
    gpu->fill(x.device().index, x.data<float>(), n, value);
    return;
  }
  float* __restrict p = x.data<float>();
  for (int64_t i = 0; i < n; ++i) p[i] = value;
}

void scale(Tensor& x, float alpha) {
  constexpr const char* op = "scale";
  detail::check_tensor(op, "x", x);
  const int64_t n = x.numel();
  if (n == 0) return;
  if (const cuda::Kernels* gpu = cuda_kernels_for(x)) {
    gpu->scale(x.device().index, x.data<float>(), n, alpha);
    return;
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
  if (const cuda::Kernels* gpu = cuda_kernels_for(x)) {
    gpu->axpy(x.device().index, alpha, x.data<float>(), y.data<float>(), n);
    return;
  }
  // x and y may be the same tensor (y += alpha y): element-wise, so no restrict on them.
  const float* px = x.data<float>();
  float* py = y.data<float>();
  for (int64_t i = 0; i < n; ++i) py[i] = axpy_element(alpha, px[i], py[i]);
}

}  // namespace tinyddp::kernels
