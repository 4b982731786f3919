// Optimizer: updates parameters from their gradients. One object, one clear step() over flat buffers.
//
// Under DDP the optimizer needs no change at all: by the time step() runs, the Reducer has replaced
// every rank's gradients with their average, so every rank applies the very same update to the very
// same weights and the replicas stay identical without ever sending weights again.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tinyddp/nn/module.h"

namespace tinyddp::nn {

class Optimizer {
 public:
  // `params` usually comes from model.named_parameters(); the names only label the state tensors.
  Optimizer(std::vector<NamedParameter> params, double lr);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Applies one update from the current gradients, with the current lr(), and counts it. Parameters
  // without a gradient (has_grad false: no backward reached them since zero_grad) are skipped, as
  // PyTorch skips a None .grad.
  virtual void step() = 0;
  // Clears every gradient, as Module::zero_grad does: by default forgets them (set_to_none), or
  // writes zeros in place. DDP's bucket views stay valid either way.
  void zero_grad(bool set_to_none = true);

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
  // names and shapes as a trained one. The tensors returned share memory with the optimizer's state:
  // copying values into them restores the state.
  virtual std::vector<std::pair<std::string, Tensor>> state_tensors() = 0;
  // Restores counters after the state tensors were copied into state_tensors()'s tensors.
  void set_step_count(int64_t steps) { step_count_ = steps; }
  // Called by load_checkpoint once the values were copied into state_tensors()'s tensors and the
  // counters set: an optimizer whose state_tensors() are a copy (ZeRO's consolidated state) takes
  // its state from them here. The others hold their state in those very tensors: nothing to do.
  virtual void state_loaded() {}

 protected:
  // Checks that `p` has a gradient of its own shape, on its own device, before an update reads it.
  static void check_gradient(const NamedParameter& p, const char* optimizer_name);

  std::vector<NamedParameter> params_;
  double lr_, initial_lr_;
  int64_t step_count_ = 0;
};

}  // namespace tinyddp::nn
