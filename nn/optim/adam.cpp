#include "nn/optim/adam.h"

#include "core/error.h"
#include "kernels/ops.h"

namespace tinyddp::nn {

Adam::Adam(std::vector<NamedParameter> params, double lr, std::pair<double, double> betas, double eps,
           double weight_decay)
    : Adam(std::move(params), lr, betas, eps, weight_decay, false) {}

Adam::Adam(std::vector<NamedParameter> params, double lr, std::pair<double, double> betas, double eps,
           double weight_decay, bool decoupled_weight_decay)
    : Optimizer(std::move(params), lr),
      beta1_(betas.first),
      beta2_(betas.second),
      eps_(eps),
      weight_decay_(weight_decay),
      decoupled_weight_decay_(decoupled_weight_decay) {
  TINYDDP_CHECK(eps >= 0, "Adam: invalid epsilon value: ", eps, "; hint: use eps >= 0 (default 1e-8)");
  TINYDDP_CHECK(beta1_ >= 0 && beta1_ < 1, "Adam: invalid beta parameter at index 0: ", beta1_,
                "; hint: betas must lie in [0, 1), default (0.9, 0.999)");
  TINYDDP_CHECK(beta2_ >= 0 && beta2_ < 1, "Adam: invalid beta parameter at index 1: ", beta2_,
                "; hint: betas must lie in [0, 1), default (0.9, 0.999)");
  TINYDDP_CHECK(weight_decay >= 0, "Adam: invalid weight_decay value: ", weight_decay,
                "; hint: use weight_decay >= 0");
}

AdamW::AdamW(std::vector<NamedParameter> params, double lr, std::pair<double, double> betas, double eps,
             double weight_decay)
    : Adam(std::move(params), lr, betas, eps, weight_decay, true) {}

void Adam::create_state() {
  if (!exp_avg_.empty()) return;
  // Created at first use rather than in the constructor, so they land on the device the model is on
  // by then (PyTorch creates them lazily in the first step for the same reason).
  for (auto& p : params_) {
    const Tensor& value = p.parameter->value;
    exp_avg_.push_back(Tensor::zeros(value.shape(), DType::f32, value.device()));
    exp_avg_sq_.push_back(Tensor::zeros(value.shape(), DType::f32, value.device()));
  }
}

void Adam::step() {
  kernels::AdamConfig config;
  config.lr = lr_;
  config.beta1 = beta1_;
  config.beta2 = beta2_;
  config.eps = eps_;
  config.weight_decay = weight_decay_;
  config.decoupled_weight_decay = decoupled_weight_decay_;
  create_state();
  ++step_count_;  // bias corrections count steps from 1
  const char* name = decoupled_weight_decay_ ? "AdamW" : "Adam";
  for (size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = *params_[i].parameter;
    if (!p.has_grad) continue;  // no backward reached it since zero_grad: PyTorch skips a None grad too
    check_gradient(params_[i], name);
    kernels::adam_step(p.value, p.grad, exp_avg_[i], exp_avg_sq_[i], config, step_count_);
  }
}

std::vector<std::pair<std::string, Tensor>> Adam::state_tensors() {
  create_state();
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    out.emplace_back("exp_avg." + params_[i].name, exp_avg_[i]);
    out.emplace_back("exp_avg_sq." + params_[i].name, exp_avg_sq_[i]);
  }
  return out;
}

}  // namespace tinyddp::nn
