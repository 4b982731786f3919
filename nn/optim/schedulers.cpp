#include "tinyddp/nn/optim/schedulers.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "tinyddp/core/error.h"

namespace tinyddp::nn {

CosineAnnealing::CosineAnnealing(Optimizer& optimizer, int64_t total_iters, double eta_min)
    : LRScheduler(optimizer), total_iters_(total_iters), eta_min_(eta_min) {
  TINYDDP_CHECK(total_iters > 0, "CosineAnnealing: total_iters is ", total_iters,
                hint("pass the number of steps (batches or epochs) the decay should take, > 0"));
  set_last_step(0);
}

CosineAnnealing::CosineAnnealing(Optimizer& optimizer, LengthOfRun, double eta_min)
    : LRScheduler(optimizer), total_iters_(0), eta_min_(eta_min), sized_by_run_(true) {
  set_last_step(0);
}

void CosineAnnealing::set_length_of_run(int64_t total_iters) {
  TINYDDP_CHECK(sized_by_run_, "CosineAnnealing::set_length_of_run: this schedule was built with total_iters ",
                total_iters_, hint("build it with nn::length_of_run to let the run size it"));
  TINYDDP_CHECK(total_iters > 0, "CosineAnnealing: the run it is sized by takes ", total_iters, " steps",
                hint("give run() at least one epoch of a loader with at least one batch"));
  total_iters_ = total_iters;
  optimizer_.set_lr(lr_at(last_step_));
}

double CosineAnnealing::lr_at(int64_t t) const {
  if (total_iters_ == 0) {  // built with length_of_run, not sized yet: only the start is known
    TINYDDP_CHECK(t == 0, "CosineAnnealing: step ", t, " of a schedule built with nn::length_of_run, before a ",
                  "Trainer's run() gave it a length", hint("let the Trainer step it, or build it with total_iters"));
    return base_lr_;
  }
  return eta_min_ + (base_lr_ - eta_min_) * (1 + std::cos(std::numbers::pi * double(t) / double(total_iters_))) / 2;
}

WarmUp::WarmUp(Optimizer& optimizer, int64_t warmup_iters, double start_factor)
    : LRScheduler(optimizer), warmup_iters_(warmup_iters), start_factor_(start_factor) {
  TINYDDP_CHECK(warmup_iters > 0, "WarmUp: warmup_iters is ", warmup_iters, hint("pass a number of steps > 0"));
  TINYDDP_CHECK(start_factor > 0 && start_factor <= 1, "WarmUp: start_factor is ", start_factor,
                hint("the starting multiplicative factor must be in (0, 1]"));
  set_last_step(0);
}

double WarmUp::lr_at(int64_t t) const {
  const double progress = double(std::clamp<int64_t>(t, 0, warmup_iters_)) / double(warmup_iters_);
  return base_lr_ * (start_factor_ + (1 - start_factor_) * progress);
}

SequentialSchedule::SequentialSchedule(Optimizer& optimizer, std::vector<std::shared_ptr<LRScheduler>> schedulers,
                                       std::vector<int64_t> milestones)
    : LRScheduler(optimizer), schedulers_(std::move(schedulers)), milestones_(std::move(milestones)) {
  TINYDDP_CHECK(!schedulers_.empty(), "SequentialSchedule: no schedulers", hint("pass at least one"));
  TINYDDP_CHECK(milestones_.size() + 1 == schedulers_.size(), "SequentialSchedule: ", schedulers_.size(),
                " schedulers need ", schedulers_.size() - 1, " milestones, got ", milestones_.size(),
                hint("milestone i is the step where scheduler i+1 takes over"));
  for (size_t i = 0; i < schedulers_.size(); ++i) {
    TINYDDP_CHECK(schedulers_[i] != nullptr, "SequentialSchedule: scheduler ", i, " is null",
                  hint("pass std::make_shared<...>(optimizer, ...)"));
    TINYDDP_CHECK(&schedulers_[i]->optimizer() == &optimizer, "SequentialSchedule: scheduler ", i, " (",
                  schedulers_[i]->kind(), ") drives another optimizer",
                  hint("build every chained scheduler on ", "the optimizer given to SequentialSchedule"));
  }
  for (size_t i = 0; i < milestones_.size(); ++i)
    TINYDDP_CHECK(milestones_[i] > (i == 0 ? 0 : milestones_[i - 1]), "SequentialSchedule: milestones must be ",
                  "positive and strictly increasing, milestone ", i, " is ", milestones_[i],
                  hint("list the steps where each next scheduler starts, in order"));
  // The chained schedulers each set the lr when they were constructed; the chain's own start wins.
  set_last_step(0);
}

double SequentialSchedule::lr_at(int64_t t) const {
  // The active scheduler is the one after the last milestone <= t; it sees its own clock, t - milestone.
  const size_t index = size_t(std::upper_bound(milestones_.begin(), milestones_.end(), t) - milestones_.begin());
  const int64_t start = index == 0 ? 0 : milestones_[index - 1];
  return schedulers_[index]->lr_at(t - start);
}

}  // namespace tinyddp::nn
