#include "tinyddp/nn/precision/loss_scaler.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "tinyddp/core/error.h"
#include "tinyddp/kernels/ops.h"

namespace tinyddp::nn {

namespace {
namespace key {
constexpr const char* scale = "loss_scaler.scale";
constexpr const char* growth_tracker = "loss_scaler.growth_tracker";
constexpr const char* skipped_steps = "loss_scaler.skipped_steps";
}  // namespace key

std::string exact_text(double value) {
  char text[40];
  std::snprintf(text, sizeof text, "%.17g", value);
  return text;
}

double parse_number(const Metadata& state, const char* name, double fallback) {
  auto it = state.find(name);
  if (it == state.end()) return fallback;
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(it->second, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  TINYDDP_CHECK(used == it->second.size() && used > 0 && std::isfinite(value), "LossScaler: the saved ", name, " is '",
                it->second, "', not a finite number", hint("the checkpoint is damaged, or was not written by tinyddp"));
  return value;
}
}  // namespace

void check_loss_scaler_options(const LossScalerOptions& o) {
  TINYDDP_CHECK(std::isfinite(o.init_scale) && o.init_scale > 0, "LossScalerOptions: init_scale is ", o.init_scale,
                hint("a finite positive scale, 65536 (2^16) as GradScaler's"));
  TINYDDP_CHECK(std::isfinite(o.growth_factor) && o.growth_factor > 1, "LossScalerOptions: growth_factor is ",
                o.growth_factor, hint("more than 1 (the scale grows after a run of finite steps), 2 as GradScaler's"));
  TINYDDP_CHECK(o.backoff_factor > 0 && o.backoff_factor < 1, "LossScalerOptions: backoff_factor is ", o.backoff_factor,
                hint("between 0 and 1 (the scale shrinks after an overflow), 0.5 as GradScaler's"));
  TINYDDP_CHECK(o.growth_interval >= 1, "LossScalerOptions: growth_interval is ", o.growth_interval,
                hint("at least 1 finite step before the scale grows, 2000 as GradScaler's"));
}

bool gradients_finite(const std::vector<Parameter*>& params) {
  double sum = 0;  // inf or NaN anywhere makes the sum of squares inf or NaN
  for (Parameter* p : params)
    if (p->has_grad) sum += kernels::sum_of_squares(p->grad);
  return std::isfinite(sum);
}

LossScaler::LossScaler(LossScalerOptions options) : options_(options), scale_(options.init_scale) {
  check_loss_scaler_options(options_);
}

void LossScaler::scale_loss_gradient(Tensor& output_grad) const { kernels::scale(output_grad, float(scale_)); }

bool LossScaler::unscale(const std::vector<Parameter*>& params, bool finite) const {
  if (!finite) return false;
  // 1/S in f32, as GradScaler computes its inv_scale; exact while S is a power of two.
  const float inverse = float(1.0 / scale_);
  for (Parameter* p : params)
    if (p->has_grad) kernels::scale(p->grad, inverse);
  return true;
}

void LossScaler::update(bool finite) {
  if (!finite) {
    scale_ *= options_.backoff_factor;
    growth_tracker_ = 0;
    ++skipped_steps_;
    return;
  }
  if (++growth_tracker_ == options_.growth_interval) {
    // Grown only while the result stays a finite f32 (GradScaler's cap): an infinite S would make every
    // gradient inf or NaN, and every step a skip.
    if (std::isfinite(float(scale_ * options_.growth_factor))) scale_ *= options_.growth_factor;
    growth_tracker_ = 0;
  }
}

Metadata LossScaler::state() const {
  return {{key::scale, exact_text(scale_)},
          {key::growth_tracker, std::to_string(growth_tracker_)},
          {key::skipped_steps, std::to_string(skipped_steps_)}};
}

void LossScaler::load_state(const Metadata& state) {
  const double scale = parse_number(state, key::scale, scale_);
  TINYDDP_CHECK(scale > 0, "LossScaler: the saved ", key::scale, " is ", scale,
                hint("a positive scale; the checkpoint is damaged"));
  const double tracker = parse_number(state, key::growth_tracker, double(growth_tracker_));
  const double skipped = parse_number(state, key::skipped_steps, double(skipped_steps_));
  TINYDDP_CHECK(tracker >= 0 && tracker == std::floor(tracker) && skipped >= 0 && skipped == std::floor(skipped),
                "LossScaler: the saved ", key::growth_tracker, " (", tracker, ") and ", key::skipped_steps, " (",
                skipped, ") must be whole numbers >= 0", hint("the checkpoint is damaged"));
  scale_ = scale;
  growth_tracker_ = int64_t(tracker);
  skipped_steps_ = int64_t(skipped);
}

}  // namespace tinyddp::nn
