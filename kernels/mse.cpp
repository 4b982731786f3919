// Mean squared error, the regression loss: its value and its gradient in one pass.
#include "tinyddp/kernels/argument_checks.h"
#include "tinyddp/kernels/cpu_sum.h"
#include "tinyddp/kernels/elementwise.h"
#include "tinyddp/kernels/ops.h"

#include "tinyddp/kernels/cuda_dispatch.h"

namespace tinyddp::kernels {

float mse(const Tensor& pred, const Tensor& target, Tensor* dpred) {
  constexpr const char* op = "mse";
  detail::check_tensor(op, "pred", pred);
  detail::check_tensor(op, "target", target);
  detail::check_like(op, "pred", pred, "target", target);
  if (dpred) {
    detail::check_tensor(op, "dpred", *dpred);
    detail::check_like(op, "pred", pred, "dpred", *dpred);
  }
  const int64_t n = pred.numel();
  TINYDDP_CHECK(n > 0, op, ": `pred` ", pred.describe(),
                " is empty, and the mean over no elements is undefined; "
                "hint: skip empty batches");
  float* d = dpred ? dpred->data<float>() : nullptr;

  if (const cuda::Kernels* gpu = cuda_kernels_for(pred)) {
    return float(gpu->mse(pred.device().index, pred.data<float>(), target.data<float>(), d, n));
  }

  const float* p = pred.data<float>();
  const float* t = target.data<float>();
  double total;
  if (d) {  // dpred may alias pred: each element is read before its gradient overwrites it
    const float two_over_n = 2.f / float(n);
    total = detail::sum_in_lanes(n, [&](int64_t i) {
      float e = squared_error(p[i], t[i]);
      d[i] = squared_error_grad(p[i], t[i], two_over_n);
      return e;
    });
  } else {
    total = detail::sum_in_lanes(n, [&](int64_t i) { return squared_error(p[i], t[i]); });
  }
  return float(total / double(n));
}

}  // namespace tinyddp::kernels
