// Optimizer: updates parameters from their gradients. One object, one clear step() over flat buffers.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "nn/module.h"

namespace tinyddp::nn {

class Optimizer {
 public:
  Optimizer(std::vector<NamedParameter> params, double lr);
  virtual ~Optimizer() = default;

  virtual void step() = 0;
  void zero_grad();

  // The learning rate the next step() uses (schedulers set it), and the one it started with.
  double lr() const { return lr_; }
  void set_lr(double lr) { lr_ = lr; }
  double initial_lr() const { return initial_lr_; }
  // Number of step() calls so far (Adam's bias correction counts from it).
  int64_t step_count() const { return step_count_; }
  const std::vector<NamedParameter>& params() const { return params_; }

  // ---- state for checkpoints ----
  // "sgd", "adam", "adamw": written into checkpoints and checked when loading.
  virtual std::string kind() const = 0;
  // Per-parameter state tensors named "<state>.<param name>" (e.g. "exp_avg.0.weight"), in a fixed
  // order; lazily created state is created (zeros) by this call, so a fresh optimizer lists the same
  // names and shapes as a trained one.
  virtual std::vector<std::pair<std::string, Tensor>> state_tensors() = 0;
  // Restores counters after the state tensors were copied into state_tensors()'s tensors.
  void set_step_count(int64_t steps) { step_count_ = steps; }

 protected:
  std::vector<NamedParameter> params_;
  double lr_, initial_lr_;
  int64_t step_count_ = 0;
};

}  // namespace tinyddp::nn
