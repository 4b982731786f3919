#include "tinyddp/nn/optim/sgd.h"

#include "tinyddp/core/error.h"
#include "tinyddp/kernels/ops.h"

namespace tinyddp::nn {

SGD::SGD(std::vector<NamedParameter> params, double lr, double momentum, double dampening, double weight_decay,
         bool nesterov)
    : Optimizer(std::move(params), lr),
      momentum_(momentum),
      dampening_(dampening),
      weight_decay_(weight_decay),
      nesterov_(nesterov) {
  TINYDDP_CHECK(momentum >= 0, "SGD: invalid momentum value: ", momentum, hint("use momentum >= 0"));
  TINYDDP_CHECK(weight_decay >= 0, "SGD: invalid weight_decay value: ", weight_decay, hint("use weight_decay >= 0"));
  TINYDDP_CHECK(!nesterov || (momentum > 0 && dampening == 0), "SGD: Nesterov momentum requires a momentum and zero",
                " dampening (got momentum ", momentum, ", dampening ", dampening, ")",
                hint("set momentum > 0 and dampening = 0, or nesterov = false"));
}

void SGD::create_state() {
  if (momentum_ == 0 || !momentum_buffers_.empty()) return;
  for (auto& p : params_)
    momentum_buffers_.push_back(Tensor::zeros(p.parameter->value.shape(), DType::f32, p.parameter->value.device()));
}

void SGD::step() {
  kernels::SgdConfig config;
  config.lr = float(lr_);
  config.momentum = float(momentum_);
  config.dampening = float(dampening_);
  config.weight_decay = float(weight_decay_);
  config.nesterov = nesterov_;
  create_state();
  // PyTorch starts the buffer as a copy of the first gradient (not as momentum * 0 + (1 - dampening) * g).
  // A restored checkpoint has step_count > 0 and its buffers already filled.
  const bool first_step = step_count_ == 0;
  Tensor no_buffer;
  for (size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = *params_[i].parameter;
    if (!p.has_grad) continue;  // no backward reached it since zero_grad: PyTorch skips a None grad too
    check_gradient(params_[i], "SGD");
    kernels::sgd_step(p.value, p.grad, momentum_ == 0 ? no_buffer : momentum_buffers_[i], config, first_step);
  }
  ++step_count_;
}

std::vector<std::pair<std::string, Tensor>> SGD::state_tensors() {
  create_state();
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < momentum_buffers_.size(); ++i)
    out.emplace_back("momentum_buffer." + params_[i].name, momentum_buffers_[i]);
  return out;
}

}  // namespace tinyddp::nn
