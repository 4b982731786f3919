#include "tinyddp/nn/linear.h"

#include <cmath>

#include "tinyddp/core/error.h"
#include "tinyddp/kernels/ops.h"

namespace tinyddp::nn {

Linear::Linear(int64_t in_features, int64_t out_features, Generator& generator, bool bias)
    : in_features_(in_features), out_features_(out_features) {
  TINYDDP_CHECK(in_features > 0 && out_features > 0, "Linear(", in_features, ", ", out_features,
                "): both sizes must be positive", hint("check the layer sizes of the model"));
  // PyTorch initialises the weight with kaiming_uniform_(a = sqrt(5)): gain = sqrt(2 / (1 + a^2)) =
  // sqrt(1/3), std = gain / sqrt(fan_in), bound = sqrt(3) * std = 1 / sqrt(fan_in). The bias uses the
  // same bound explicitly. The weight is drawn first, then the bias, as in nn.Linear.reset_parameters.
  const float bound = float(1.0 / std::sqrt(double(in_features)));
  Tensor w = Tensor::empty({out_features, in_features});
  fill_uniform(w, -bound, bound, generator);
  weight_ = &register_parameter("weight", w);
  if (bias) {
    Tensor b = Tensor::empty({out_features});
    fill_uniform(b, -bound, bound, generator);
    bias_ = &register_parameter("bias", b);
  }
}

Parameter& Linear::bias() {
  TINYDDP_CHECK(bias_ != nullptr, describe(), " has no bias", hint("construct it with bias = true"));
  return *bias_;
}

Tensor Linear::forward(const Tensor& input) {
  TINYDDP_CHECK(input.dim() == 2 && input.size(1) == in_features_, describe(), ".forward: expected input [batch, ",
                in_features_, "], got ", input.describe(), hint("flatten the input to [batch, features]"));
  TINYDDP_CHECK(input.device() == device_, describe(), ".forward: the input is on ", input.device().str(),
                " but the layer is on ", device_.str(), hint("move the model or the batch with .to(device)"));
  precision_ = current_precision();
  const DType narrow = operand_dtype(precision_);
  TINYDDP_CHECK(input.dtype() == DType::f32 || (is_mixed(precision_) && input.dtype() == narrow), describe(),
                ".forward: the input is ", input.describe(), " but must be f32",
                is_mixed(precision_) ? std::string(" or ") + dtype_name(narrow) : std::string(),
                hint(is_mixed(precision_) ? "convert it to f32" : "convert it to f32, or run under a mixed precision"));
  Tensor output = Tensor::empty({input.size(0), out_features_}, DType::f32, device_);
  if (!is_mixed(precision_)) {
    kernels::gemm(input, false, weight_->value, true, output);  // y = x W^T
    input_ = input;
  } else {
    announce_precision(precision_, device_);
    const DType stored = kernels::mixed_operand_dtype(narrow, device_);
    // Backward keeps the rounded input in the narrow type: half the bytes of f32. Where the GEMM
    // takes f32 operands (CPUs without bf16 units), the f32 copy of the same values is a temporary.
    Tensor x = input;
    if (input.dtype() != narrow) {
      input_ = Tensor::empty(input.shape(), narrow, device_);
      if (stored == narrow) {
        kernels::round_to(input, narrow, input_);
        x = input_;
      } else {
        x = Tensor::empty(input.shape(), DType::f32, device_);
        kernels::round_to_both(input, narrow, input_, x);
      }
    } else {
      input_ = input;  // rounded already
      if (stored != narrow) {
        x = Tensor::empty(input.shape(), DType::f32, device_);
        kernels::convert(input, x);
      }
    }
    if (!weight_operand_.defined() || weight_operand_.dtype() != stored || weight_operand_.device() != device_)
      weight_operand_ = Tensor::empty(weight_->value.shape(), stored, device_);
    kernels::round_to(weight_->value, narrow, weight_operand_);  // the master weight stays f32
    kernels::gemm(x, false, weight_operand_, true, output);      // y = x W^T, summed in f32
  }
  if (bias_) kernels::bias_add(output, bias_->value);
  return output;
}

Tensor Linear::backward(const Tensor& grad_output, bool want_input_grad) {
  TINYDDP_CHECK(input_.defined(), describe(), ".backward called before forward", hint("run forward first"));
  TINYDDP_CHECK(grad_output.shape() == Shape({input_.size(0), out_features_}), describe(),
                ".backward: expected grad_output [", input_.size(0), ", ", out_features_, "], got ",
                grad_output.describe(), hint("pass the gradient of this layer's forward output"));
  // The first backward after zero_grad() overwrites the gradient (beta = 0: no memset of it beforehand,
  // no read of stale numbers); a later one accumulates (beta = 1), as PyTorch's .grad does, which is
  // what makes gradient accumulation over micro-batches (and DDP's no_sync()) work.
  //
  // The bias first, then the weight, each announced as soon as it is final: PyTorch's autograd runs
  // addmm's backward this way round too (its bias gradient is a separate node that finishes first),
  // so DDP's hooks fire in the same order as PyTorch's -- the order the Reducer records in the first
  // iteration to rebuild its buckets. Announcing *before* computing dx is the point of DDP's design:
  // the Reducer can start all-reducing this layer's bucket while we (and the earlier layers) keep
  // computing, so communication hides behind the rest of backward.
  //
  // Under a mixed precision both GEMMs take dy rounded once -- in the same pass as db's column sums,
  // which read the f32 dy -- and write f32.
  Tensor dy = grad_output, x = input_;
  const Tensor* weight = &weight_->value;
  if (is_mixed(precision_)) {
    const DType narrow = operand_dtype(precision_), stored = kernels::mixed_operand_dtype(narrow, device_);
    dy = Tensor::empty(grad_output.shape(), stored, device_);
    if (bias_)
      kernels::bias_grad_and_round(grad_output, bias_->grad, bias_->begin_grad_write(), narrow, dy);
    else
      kernels::round_to(grad_output, narrow, dy);
    if (stored != input_.dtype()) {  // the f32 GEMM's operand: the kept narrow input, widened (exact)
      x = Tensor::empty(input_.shape(), stored, device_);
      kernels::convert(input_, x);
    }
    weight = &weight_operand_;
  } else if (bias_) {
    kernels::bias_grad(grad_output, bias_->grad, bias_->begin_grad_write());  // db (+)= sum over rows of dy
  }
  if (bias_) bias_->mark_grad_ready();
  kernels::gemm(dy, true, x, false, weight_->grad, 1.f, weight_->begin_grad_write());  // dW (+)= dy^T x
  weight_->mark_grad_ready();
  if (!want_input_grad) return Tensor();
  Tensor grad_input = Tensor::empty(input_.shape(), DType::f32, device_);
  kernels::gemm(dy, false, *weight, false, grad_input);  // dx = dy W
  return grad_input;
}

std::string Linear::describe() const {
  return detail::concat("Linear(in_features=", in_features_, ", out_features=", out_features_,
                        ", bias=", bias_ ? "True" : "False", ")");
}

}  // namespace tinyddp::nn
