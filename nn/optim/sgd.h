// SGD with momentum, dampening, weight decay and Nesterov: torch.optim.SGD's update, step for step.
//
//   g = grad + weight_decay * p
//   buf = g on the first step, else momentum * buf + (1 - dampening) * g
//   g = nesterov ? g + momentum * buf : buf        (only when momentum != 0)
//   p -= lr * g
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "tinyddp/core/tensor.h"
#include "tinyddp/nn/optim/optimizer.h"

namespace tinyddp::nn {

class SGD : public Optimizer {
 public:
  SGD(std::vector<NamedParameter> params, double lr, double momentum = 0, double dampening = 0, double weight_decay = 0,
      bool nesterov = false);

  void step() override;
  std::string kind() const override { return "sgd"; }
  // "momentum_buffer.<name>" per parameter, or nothing when momentum == 0 (plain SGD has no state).
  std::vector<std::pair<std::string, Tensor>> state_tensors() override;

  double momentum() const { return momentum_; }
  double dampening() const { return dampening_; }
  double weight_decay() const { return weight_decay_; }
  bool nesterov() const { return nesterov_; }

 private:
  void create_state();

  double momentum_, dampening_, weight_decay_;
  bool nesterov_;
  std::vector<Tensor> momentum_buffers_;  // one per parameter once created (when momentum != 0)
};

}  // namespace tinyddp::nn
