// The optimizer updates: one pass over a parameter's flat buffer, reading the gradient and the
// optimizer state and writing the new parameter and state in place (kernels/elementwise.h has the
// per-element formulas, PyTorch 1.13's).
#include <cmath>

#include "tinyddp/kernels/argument_checks.h"
#include "tinyddp/kernels/cpu_vector_clones.h"
#include "tinyddp/kernels/elementwise.h"
#include "tinyddp/kernels/ops.h"

#include "tinyddp/kernels/cuda_dispatch.h"

namespace tinyddp::kernels {

namespace {
// The CPU loop of adam_step, built for AVX2 and for plain x86-64 (kernels/cpu_vector_clones.h).
TINYDDP_CPU_VECTOR_CLONES
void adam_cpu(float* __restrict p, const float* __restrict g, float* __restrict m, float* __restrict v, int64_t n,
              const AdamScalars& s) {
  for (int64_t i = 0; i < n; ++i) adam_update(p[i], g[i], m[i], v[i], s);
}
}  // namespace

void sgd_step(Tensor& param, const Tensor& grad, Tensor& momentum_buffer, const SgdConfig& config, bool first_step) {
  constexpr const char* op = "sgd_step";
  detail::check_tensor(op, "param", param);
  detail::check_tensor(op, "grad", grad);
  detail::check_like(op, "param", param, "grad", grad);
  const bool use_momentum = config.momentum != 0.f;
  if (use_momentum) {
    detail::check_tensor(op, "momentum_buffer", momentum_buffer);
    detail::check_like(op, "param", param, "momentum_buffer", momentum_buffer);
  }
  // The same argument rules as torch.optim.SGD's constructor.
  TINYDDP_CHECK(config.lr >= 0.f, op, ": lr = ", config.lr, " is negative", hint("use a learning rate >= 0"));
  TINYDDP_CHECK(config.momentum >= 0.f, op, ": momentum = ", config.momentum, " is negative",
                hint("use 0 <= momentum < 1"));
  TINYDDP_CHECK(config.weight_decay >= 0.f, op, ": weight_decay = ", config.weight_decay, " is negative",
                hint("use weight_decay >= 0"));
  TINYDDP_CHECK(!config.nesterov || (use_momentum && config.dampening == 0.f), op,
                ": nesterov momentum needs momentum > 0 and dampening = 0, got momentum = ", config.momentum,
                ", dampening = ", config.dampening, hint("set a momentum and no dampening, or turn nesterov off"));

  const SgdScalars s{config.lr, config.momentum, config.dampening, config.weight_decay, config.nesterov, first_step};
  const int64_t n = param.numel();
  float* buf = use_momentum ? momentum_buffer.data<float>() : nullptr;
  if (const cuda::Kernels* gpu = cuda_kernels_for(param)) {
    gpu->sgd_step(param.device().index, param.data<float>(), grad.data<float>(), buf, n, s);
    return;
  }
  float* __restrict p = param.data<float>();
  const float* __restrict g = grad.data<float>();
  if (use_momentum) {
    float* __restrict b = buf;
    for (int64_t i = 0; i < n; ++i) sgd_update(p[i], g[i], b[i], s);
  } else {
    float unused = 0.f;  // sgd_update does not touch the buffer without momentum
    for (int64_t i = 0; i < n; ++i) sgd_update(p[i], g[i], unused, s);
  }
}

// The argument rules of torch.optim.Adam's constructor, in its words.
void check_adam_config(const AdamConfig& config) {
  TINYDDP_CHECK(config.lr >= 0, "Adam: invalid learning rate: ", config.lr, hint("use a learning rate >= 0"));
  TINYDDP_CHECK(config.eps >= 0, "Adam: invalid epsilon value: ", config.eps,
                hint("use a small positive eps such as 1e-8"));
  const double betas[2] = {config.beta1, config.beta2};
  for (int i = 0; i < 2; ++i)
    TINYDDP_CHECK(betas[i] >= 0 && betas[i] < 1, "Adam: invalid beta parameter at index ", i, ": ", betas[i],
                  hint("betas must both lie in [0, 1), the usual values are (0.9, 0.999)"));
  TINYDDP_CHECK(config.weight_decay >= 0, "Adam: invalid weight_decay value: ", config.weight_decay,
                hint("use weight_decay >= 0"));
}

void adam_step(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, const AdamConfig& config,
               int64_t step) {
  constexpr const char* op = "adam_step";
  detail::check_tensor(op, "param", param);
  detail::check_tensor(op, "grad", grad);
  detail::check_tensor(op, "exp_avg", exp_avg);
  detail::check_tensor(op, "exp_avg_sq", exp_avg_sq);
  detail::check_like(op, "param", param, "grad", grad);
  detail::check_like(op, "param", param, "exp_avg", exp_avg);
  detail::check_like(op, "param", param, "exp_avg_sq", exp_avg_sq);
  TINYDDP_CHECK(step >= 1, op, ": step = ", step,
                " but steps count from 1 (the bias correction divides by 1 - beta^step)",
                hint("pass the number of steps taken including this one"));
  check_adam_config(config);

  // The bias corrections depend on the step only: computed once here, in double, as PyTorch does.
  const double bias_correction1 = 1.0 - std::pow(config.beta1, double(step));
  const double bias_correction2 = 1.0 - std::pow(config.beta2, double(step));
  const AdamScalars s{float(config.beta1),
                      float(config.beta2),
                      float(config.eps),
                      float(config.weight_decay),
                      float(1.0 - config.beta1),
                      float(1.0 - config.beta2),
                      config.decoupled_weight_decay,
                      float(1.0 - config.lr * config.weight_decay),
                      float(config.lr / bias_correction1),
                      float(std::sqrt(bias_correction2))};
  const int64_t n = param.numel();
  if (const cuda::Kernels* gpu = cuda_kernels_for(param)) {
    gpu->adam_step(param.device().index, param.data<float>(), grad.data<float>(), exp_avg.data<float>(),
                   exp_avg_sq.data<float>(), n, s);
    return;
  }
  adam_cpu(param.data<float>(), grad.data<float>(), exp_avg.data<float>(), exp_avg_sq.data<float>(), n, s);
}

}  // namespace tinyddp::kernels
