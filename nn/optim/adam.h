// Adam and AdamW: torch.optim.Adam / torch.optim.AdamW (amsgrad off), with PyTorch's defaults.
//
//   t = step count (from 1);  g = grad (+ weight_decay * p for Adam)
//   m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g^2
//   p -= lr * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)
//
// AdamW differs only in where the weight decay goes: instead of adding it to the gradient (where
// Adam's normalisation would rescale it), it shrinks the weights directly, p *= 1 - lr * weight_decay,
// before the update ("decoupled" weight decay, Loshchilov & Hutter).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "tinyddp/core/tensor.h"
#include "tinyddp/kernels/ops.h"
#include "tinyddp/nn/optim/optimizer.h"

namespace tinyddp::nn {

class Adam : public Optimizer {
 public:
  Adam(std::vector<NamedParameter> params, double lr = 1e-3, std::pair<double, double> betas = {0.9, 0.999},
       double eps = 1e-8, double weight_decay = 0);

  void step() override;
  std::string kind() const override { return "adam"; }
  // "exp_avg.<name>" and "exp_avg_sq.<name>", parameter by parameter.
  std::vector<std::pair<std::string, Tensor>> state_tensors() override;

  std::pair<double, double> betas() const { return {config_.beta1, config_.beta2}; }
  double eps() const { return config_.eps; }
  double weight_decay() const { return config_.weight_decay; }

 protected:
  Adam(std::vector<NamedParameter> params, double lr, std::pair<double, double> betas, double eps, double weight_decay,
       bool decoupled_weight_decay);

 private:
  void create_state();

  kernels::AdamConfig config_;                // checked once, at construction; step() sets only its lr
  std::vector<Tensor> exp_avg_, exp_avg_sq_;  // one each per parameter, created on the first use
};

class AdamW : public Adam {
 public:
  AdamW(std::vector<NamedParameter> params, double lr = 1e-3, std::pair<double, double> betas = {0.9, 0.999},
        double eps = 1e-8, double weight_decay = 1e-2);

  std::string kind() const override { return "adamw"; }
};

}  // namespace tinyddp::nn
