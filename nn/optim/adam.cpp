#include "tinyddp/nn/optim/adam.h"

#include "tinyddp/core/error.h"
#include "tinyddp/kernels/ops.h"

namespace tinyddp::nn {

Adam::Adam(std::vector<NamedParameter> params, double lr, std::pair<double, double> betas, double eps,
           double weight_decay)
    : Adam(std::move(params), lr, betas, eps, weight_decay, false) {}

Adam::Adam(std::vector<NamedParameter> params, double lr, std::pair<double, double> betas, double eps,
           double weight_decay, bool decoupled_weight_decay)
    : Optimizer(std::move(params), lr) {
  config_.lr = lr;
  config_.beta1 = betas.first;
  config_.beta2 = betas.second;
  config_.eps = eps;
  config_.weight_decay = weight_decay;
  config_.decoupled_weight_decay = decoupled_weight_decay;
  kernels::check_adam_config(config_);
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
  config_.lr = lr_;  // a scheduler may have changed it
  create_state();
  ++step_count_;  // bias corrections count steps from 1
  const char* name = config_.decoupled_weight_decay ? "AdamW" : "Adam";
  for (size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = *params_[i].parameter;
    if (!p.has_grad) continue;  // no backward reached it since zero_grad: PyTorch skips a None grad too
    check_gradient(params_[i], name);
    kernels::adam_step(p.value, p.grad, exp_avg_[i], exp_avg_sq_[i], config_, step_count_);
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
