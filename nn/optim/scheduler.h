// Learning-rate schedulers. A scheduler owns a step counter t and, on each step(), writes
// lr(t) into its optimizer. Whether one step is a batch or an epoch is the caller's choice.
//
// Every schedule here is a closed form lr_at(t) of the optimizer's initial lr. PyTorch computes most
// of its schedules recursively from the previous lr; the two agree up to rounding, and the closed form
// is what makes resuming from a checkpoint exact (set_last_step(t) needs no history).
#pragma once

#include <cstdint>
#include <string>

#include "nn/optim/optimizer.h"

namespace tinyddp::nn {

class LRScheduler {
 public:
  explicit LRScheduler(Optimizer& optimizer) : optimizer_(optimizer), base_lr_(optimizer.initial_lr()) {}
  virtual ~LRScheduler() = default;

  // Advances t by one and sets the optimizer's lr to lr_at(t).
  void step() {
    ++last_step_;
    optimizer_.set_lr(lr_at(last_step_));
  }
  // The learning rate this schedule gives at step t (t = 0 is the start: the base lr for most).
  virtual double lr_at(int64_t t) const = 0;
  int64_t last_step() const { return last_step_; }
  // Used when resuming from a checkpoint: jump to step t and set the optimizer's lr accordingly.
  void set_last_step(int64_t t) {
    last_step_ = t;
    optimizer_.set_lr(lr_at(t));
  }
  double base_lr() const { return base_lr_; }
  Optimizer& optimizer() const { return optimizer_; }
  virtual std::string kind() const = 0;

 protected:
  Optimizer& optimizer_;
  double base_lr_;
  int64_t last_step_ = 0;
};

}  // namespace tinyddp::nn
