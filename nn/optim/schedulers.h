// Learning-rate schedulers: cosine annealing, linear warm-up, and a chain of schedules (warm-up then
// cosine). A scheduler owns a step counter t and, on each step(), writes lr(t) into its optimizer.
// Whether one step is a batch or an epoch is the caller's choice. Each one sets the optimizer's lr
// to lr_at(0) when it is constructed, as PyTorch's schedulers do.
//
// Every schedule here is a closed form lr_at(t) of the optimizer's initial lr. PyTorch computes most
// of its schedules recursively from the previous lr; the two agree up to rounding, and the closed form
// is what makes resuming from a checkpoint exact (set_last_step(t) needs no history).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tinyddp/nn/optim/optimizer.h"

namespace tinyddp::nn {

// Passed for total_iters: the schedule lasts exactly as long as the Trainer run that steps it, which
// sets the length when run() starts -- the epochs times this rank's batches per epoch when it steps
// per batch, the epochs when it steps per epoch. A length written as epochs * loader.size(), as
// PyTorch users write it, is half of that under MultiDevice with 2 workers, each of which trains on
// half of the loader; the Trainer refuses such a length (see Trainer::run), this one cannot be wrong.
//
//   nn::CosineAnnealing schedule(optimizer, nn::length_of_run);
struct LengthOfRun {};
inline constexpr LengthOfRun length_of_run{};

// The base of every schedule: the step counter, and lr_at(t) written into the optimizer.
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

// lr(t) = eta_min + (base - eta_min) * (1 + cos(pi * t / total_iters)) / 2
//
// From base at t = 0 down to eta_min at t = total_iters. Past total_iters the formula is *not*
// clamped: it keeps following the cosine, rising back to base at 2 * total_iters and so on with
// period 2 * total_iters. That is what PyTorch's CosineAnnealingLR(T_max = total_iters) does, and it
// is why total_iters should cover the whole run (or use SequentialSchedule to hold a constant after).
class CosineAnnealing : public LRScheduler {
 public:
  CosineAnnealing(Optimizer& optimizer, int64_t total_iters, double eta_min = 0);
  // Sized by the Trainer's run (see length_of_run); stepping it before a run has sized it is an error.
  CosineAnnealing(Optimizer& optimizer, LengthOfRun, double eta_min = 0);
  double lr_at(int64_t t) const override;
  std::string kind() const override { return "cosine"; }

  // 0 while a schedule built with length_of_run has not been sized yet.
  int64_t total_iters() const { return total_iters_; }
  double eta_min() const { return eta_min_; }
  bool sized_by_run() const { return sized_by_run_; }
  // The Trainer's part: the number of steps of the run about to start. Only for length_of_run schedules.
  void set_length_of_run(int64_t total_iters);

 private:
  int64_t total_iters_;
  double eta_min_;
  bool sized_by_run_ = false;
};

// Linear warm-up: lr(t) = base * (start_factor + (1 - start_factor) * min(t, warmup_iters) / warmup_iters),
// from base * start_factor at t = 0 up to base at t = warmup_iters, then constant.
// PyTorch's LinearLR(start_factor, end_factor = 1, total_iters = warmup_iters).
// Warm-up matters for DDP: the global batch grows with the number of ranks, and large batches are
// usually paired with a larger lr that is only safe once the first steps have settled the weights.
class WarmUp : public LRScheduler {
 public:
  WarmUp(Optimizer& optimizer, int64_t warmup_iters, double start_factor);
  double lr_at(int64_t t) const override;
  std::string kind() const override { return "warmup"; }

  int64_t warmup_iters() const { return warmup_iters_; }
  double start_factor() const { return start_factor_; }

 private:
  int64_t warmup_iters_;
  double start_factor_;
};

// Runs schedulers one after another: schedulers[0] for t < milestones[0], then schedulers[i] with its
// own clock restarted, t - milestones[i-1], for milestones[i-1] <= t < milestones[i]. PyTorch's
// SequentialLR. The chained schedulers are used only through lr_at(); they must drive the same
// optimizer, and their own step() should not be called.
//
//   SequentialSchedule schedule(opt, {std::make_shared<WarmUp>(opt, 5, 0.1),
//                                     std::make_shared<CosineAnnealing>(opt, 95)}, {5});
class SequentialSchedule : public LRScheduler {
 public:
  SequentialSchedule(Optimizer& optimizer, std::vector<std::shared_ptr<LRScheduler>> schedulers,
                     std::vector<int64_t> milestones);
  double lr_at(int64_t t) const override;
  std::string kind() const override { return "sequential"; }

  const std::vector<std::shared_ptr<LRScheduler>>& schedulers() const { return schedulers_; }
  const std::vector<int64_t>& milestones() const { return milestones_; }

 private:
  std::vector<std::shared_ptr<LRScheduler>> schedulers_;
  std::vector<int64_t> milestones_;
};

}  // namespace tinyddp::nn
