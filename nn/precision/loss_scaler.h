// LossScaler: dynamic loss scaling for fp16 mixed precision, as PyTorch's torch.cuda.amp.GradScaler.
//
// fp16 ends at 65504 and its smallest subnormal is 2^-24 (6e-8). A loss gradient rounded to fp16 for
// the GEMMs loses every value below that: small gradients become zero and the model stops learning.
// Multiplying the loss (its gradient) by a large scale S lifts them into fp16's range; the f32
// gradients that come out are S times too large, so they are divided by S ("unscaled") before
// anything reads them -- clipping, the optimizer. Too large an S overflows instead (a rounded dy
// becomes infinite), so S is found as the run goes:
//
//   a step whose gradients are all finite   the optimizer steps; after `growth_interval` such steps
//                                           in a row, S *= growth_factor (try a larger scale)
//   a step with an inf or NaN gradient      the optimizer does not step (the gradients are thrown
//                                           away); S *= backoff_factor, and the count starts again
//
// Under DDP the finite check reads the averaged gradients, which every rank holds alike (an inf on
// one rank is an inf in the average), so every rank skips the same steps and keeps the same S; under
// ZeRO-1 ZeroRedundancyOptimizer::gradients_finite is that check (one all-reduce). S stays a power of
// two (PyTorch's defaults), so scaling and unscaling are exact.
//
// The Trainer does all of this when TrainerOptions::precision is fp16. A hand-written loop:
//
//   nn::LossScaler scaler;                                      // scaler = GradScaler()
//   { nn::PrecisionScope half(nn::Precision::fp16); logits = model.forward(x); }
//   loss = loss_fn.forward(logits, y);
//   Tensor dlogits = loss_fn.backward();
//   scaler.scale_loss_gradient(dlogits);                        // scaler.scale(loss).backward()
//   model.backward(dlogits);
//   const bool finite = nn::gradients_finite(params);           // (under DDP: after the all-reduce)
//   scaler.unscale(params, finite);                             // scaler.unscale_(optimizer)
//   if (finite) { clip_grad_norm(params, 1.0); optimizer.step(); }   // scaler.step(optimizer)
//   scaler.update(finite);                                      // scaler.update()
#pragma once

#include <cstdint>
#include <vector>

#include "tinyddp/core/safetensors.h"
#include "tinyddp/nn/module.h"

namespace tinyddp::nn {

// PyTorch's GradScaler defaults.
struct LossScalerOptions {
  // false: no loss scaling, which fp16 training refuses (its small gradients would vanish).
  bool enabled = true;
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

// Throws unless the options are usable: init_scale finite and > 0, growth_factor > 1,
// backoff_factor in (0, 1), growth_interval >= 1 (each error says which and what it holds).
void check_loss_scaler_options(const LossScalerOptions& options);

// True when every gradient of `params` that exists (has_grad) is finite. A local check: under DDP call
// it after backward, on the averaged gradients, and every rank gets the same answer.
bool gradients_finite(const std::vector<Parameter*>& params);

class LossScaler {
 public:
  explicit LossScaler(LossScalerOptions options = {});

  // S, the factor the loss gradient is multiplied by now.
  double scale() const { return scale_; }
  const LossScalerOptions& options() const { return options_; }
  // Steps in a row with finite gradients since the last change of S.
  int64_t growth_tracker() const { return growth_tracker_; }
  // Steps skipped for an inf or NaN gradient, in all.
  int64_t skipped_steps() const { return skipped_steps_; }

  // output_grad *= S: the gradient the backward pass starts from (in place).
  void scale_loss_gradient(Tensor& output_grad) const;
  // When `gradients_finite`, divides every existing gradient of `params` by S (before clipping and the
  // optimizer read them); otherwise leaves them (they are thrown away). Returns gradients_finite.
  bool unscale(const std::vector<Parameter*>& params, bool gradients_finite) const;
  // Records one step's outcome and moves S as the header says.
  void update(bool gradients_finite);

  // The state a checkpoint keeps: "loss_scaler.scale", "loss_scaler.growth_tracker",
  // "loss_scaler.skipped_steps" (exact text: S reads back to the same double).
  Metadata state() const;
  // Restores what state() wrote; keys that are absent keep their values (a checkpoint from an fp32 run
  // starts fp16 at init_scale). A value that does not parse is an error naming the key.
  void load_state(const Metadata& state);

 private:
  LossScalerOptions options_;
  double scale_;
  int64_t growth_tracker_ = 0;
  int64_t skipped_steps_ = 0;
};

}  // namespace tinyddp::nn
