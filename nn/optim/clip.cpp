#include "tinyddp/nn/optim/clip.h"

#include <cmath>

#include "tinyddp/core/error.h"
#include "tinyddp/kernels/ops.h"

namespace tinyddp::nn {

double clip_grad_norm(const std::vector<Parameter*>& params, double max_norm) {
  TINYDDP_CHECK(max_norm >= 0, "clip_grad_norm: max_norm is ", max_norm, hint("use a max_norm >= 0"));
  // The norm of the concatenation of all gradients (not a per-tensor norm): clipping rescales the
  // whole update direction and never changes it.
  // Parameters whose gradient is "none" (has_grad false: zero_grad set it to none and no backward
  // reached them since) hold stale numbers: skipped, as clip_grad_norm_ skips a None .grad.
  double sum_of_squares = 0;
  for (Parameter* p : params) {
    TINYDDP_CHECK(p != nullptr && p->grad.defined(), "clip_grad_norm: a parameter without a gradient",
                  hint("pass model.parameters()"));
    if (p->has_grad) sum_of_squares += kernels::sum_of_squares(p->grad);
  }
  const double total = std::sqrt(sum_of_squares);
  const double factor = max_norm / (total + 1e-6);
  if (factor < 1)
    for (Parameter* p : params)
      if (p->has_grad) kernels::scale(p->grad, float(factor));
  return total;
}

}  // namespace tinyddp::nn
