// Reductions to one host number. sum_of_squares is what gradient clipping needs: the global norm of
// all gradients is sqrt(sum over parameters of sum_of_squares(grad)).
#include "tinyddp/kernels/argument_checks.h"
#include "tinyddp/kernels/cpu_sum.h"
#include "tinyddp/kernels/ops.h"

#include "tinyddp/kernels/cuda_dispatch.h"

namespace tinyddp::kernels {

double sum_of_squares(const Tensor& x) {
  constexpr const char* op = "sum_of_squares";
  detail::check_tensor(op, "x", x);
  const int64_t n = x.numel();
  if (n == 0) return 0.0;
  if (const cuda::Kernels* gpu = cuda_kernels_for(x)) {
    return gpu->sum_of_squares(x.device().index, x.data<float>(), n);
  }
  const float* p = x.data<float>();
  // Squared in double too: a float square of 1e20 would already be infinite.
  return detail::sum_in_lanes(n, [&](int64_t i) { return double(p[i]) * double(p[i]); });
}

}  // namespace tinyddp::kernels
