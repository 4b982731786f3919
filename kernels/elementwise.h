// The per-element math of every kernel, written once.
//
// Each function here is TINYDDP_HD: g++ compiles it as a plain inline function for the CPU loops in
// kernels/*.cpp, nvcc as __host__ __device__ for the CUDA kernels in kernels/cuda/*.cu. The loops
// around these functions differ (a for loop on the CPU, a grid-stride loop on the GPU), the
// arithmetic does not. So when the CPU tests agree with PyTorch, the GPU runs the same verified
// formulas, and the GPU suite only has to show that the loops cover every element once.
//
// Only C math functions (expf, erff, sqrtf, logf) appear here: they exist with the same names on
// both sides, where std:: overloads are not all available in device code.
#pragma once

#include <math.h>

#include "tinyddp/core/hd.h"

namespace tinyddp::kernels {

// ---- activations ---------------------------------------------------------------------------------

// max(x, 0), written so that NaN stays NaN as in torch.relu (fmaxf would turn it into 0).
TINYDDP_HD float relu(float x) { return x < 0.f ? 0.f : x; }
// d relu / dx is 1 where x > 0 and 0 elsewhere, x == 0 included (PyTorch's threshold_backward).
TINYDDP_HD float relu_grad(float x, float dy) { return x > 0.f ? dy : 0.f; }

// Exact GELU, x * Phi(x) with Phi the standard normal CDF: 0.5 * x * (1 + erf(x / sqrt(2))).
// PyTorch's default (approximate='none'); the tanh approximation is a different function.
constexpr float kInvSqrt2 = 0.70710678118654752440f;    // 1 / sqrt(2)
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;  // 1 / sqrt(2 pi), the normal density at 0
TINYDDP_HD float gelu(float x) { return 0.5f * x * (1.f + erff(x * kInvSqrt2)); }
// d/dx [x Phi(x)] = Phi(x) + x phi(x), phi(x) = exp(-x^2/2) / sqrt(2 pi) the normal density.
TINYDDP_HD float gelu_grad(float x, float dy) {
  float cdf = 0.5f * (1.f + erff(x * kInvSqrt2));
  float pdf = expf(-0.5f * x * x) * kInvSqrt2Pi;
  return dy * (cdf + x * pdf);
}

// ---- softmax cross-entropy, one row at a time ------------------------------------------------------
// For a row x of C logits and its label y:
//   loss = logsumexp(x) - x[y],  logsumexp(x) = m + log(sum_j exp(x[j] - m)),  m = max_j x[j]
// Subtracting the row maximum m keeps every exp() argument <= 0, so logits of +-50 or +-1000 neither
// overflow nor vanish to a 0/0. The gradient of the batch mean with respect to x[j] is
//   (softmax(x)[j] - [j == y]) / N,  softmax(x)[j] = exp(x[j] - m) / sum.

// One term of the normaliser: exp(x - m) <= 1.
TINYDDP_HD float softmax_numerator(float x, float row_max) { return expf(x - row_max); }
// The row's loss from its maximum, its normaliser sum_j exp(x[j] - m) and its label's logit.
TINYDDP_HD float cross_entropy_row_loss(float row_max, float normaliser, float label_logit) {
  return row_max + logf(normaliser) - label_logit;
}
// d(mean loss)/dx[j] from exp(x[j] - m) (the numerator), 1/sum, whether j is the label, and 1/N.
TINYDDP_HD float cross_entropy_grad(float numerator, float inv_normaliser, bool is_label, float inv_batch) {
  return (numerator * inv_normaliser - (is_label ? 1.f : 0.f)) * inv_batch;
}

// ---- mean squared error --------------------------------------------------------------------------
// loss = mean((p - t)^2), d loss / d p = 2 (p - t) / numel.
TINYDDP_HD float squared_error(float pred, float target) {
  float d = pred - target;
  return d * d;
}
TINYDDP_HD float squared_error_grad(float pred, float target, float two_over_numel) {
  return (pred - target) * two_over_numel;
}

// ---- BLAS-1 --------------------------------------------------------------------------------------
TINYDDP_HD float axpy_element(float alpha, float x, float y) { return y + alpha * x; }
TINYDDP_HD float scale_element(float alpha, float x) { return alpha * x; }
// out = beta * out + value, where beta == 0 means "overwrite" (the old value is never read, so an
// uninitialised or NaN-filled gradient buffer is simply replaced, the BLAS convention).
TINYDDP_HD float accumulate(float beta, float out, float value) { return beta == 0.f ? value : beta * out + value; }

// ---- optimizers ----------------------------------------------------------------------------------

// The scalars of one SGD step, the same for every element.
struct SgdScalars {
  float lr, momentum, dampening, weight_decay;
  bool nesterov;
  bool first_step;  // the momentum buffer does not exist yet: it starts as the gradient itself
};

// torch.optim.SGD (PyTorch 1.13, _single_tensor_sgd) for one element:
//   g = g + wd * p
//   buf = first ? g : momentum * buf + (1 - dampening) * g       (only when momentum != 0)
//   g = nesterov ? g + momentum * buf : buf                      (only when momentum != 0)
//   p = p - lr * g
// `buf` is not touched when momentum == 0 (the caller may pass a dummy).
TINYDDP_HD void sgd_update(float& param, float grad, float& buf, const SgdScalars& s) {
  float g = grad + s.weight_decay * param;
  if (s.momentum != 0.f) {
    float b = s.first_step ? g : s.momentum * buf + (1.f - s.dampening) * g;
    buf = b;
    g = s.nesterov ? g + s.momentum * b : b;
  }
  param = param - s.lr * g;
}

// The scalars of one Adam/AdamW step. The bias corrections depend only on the step number, so the
// host computes them once per step (in double, as PyTorch does in Python) instead of per element.
struct AdamScalars {
  float beta1, beta2, eps, weight_decay;
  float one_minus_beta1, one_minus_beta2;  // rounded from double, as PyTorch passes alpha = 1 - beta1
  bool decoupled_weight_decay;             // AdamW
  float decay_factor;                      // AdamW: 1 - lr * wd, rounded from double
  float step_size;                         // lr / (1 - beta1^t)
  float bias_correction2_sqrt;             // sqrt(1 - beta2^t)
};

// torch.optim.Adam / AdamW (PyTorch 1.13, _single_tensor_adam, amsgrad off) for one element:
//   Adam:  g = g + wd * p              AdamW:  p = p * (1 - lr * wd)
//   m = beta1 * m + (1 - beta1) * g            (first moment: a running mean of gradients)
//   v = beta2 * v + (1 - beta2) * g^2          (second moment: a running mean of squared gradients)
//   p = p - step_size * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// Both moments start at zero, so early on they are biased towards zero; dividing by 1 - beta^t
// (folded into step_size and the denominator) undoes that bias.
TINYDDP_HD void adam_update(float& param, float grad, float& exp_avg, float& exp_avg_sq, const AdamScalars& s) {
  float p = param;
  float g = grad;
  if (s.decoupled_weight_decay)
    p = p * s.decay_factor;
  else
    g = g + s.weight_decay * p;
  float m = s.beta1 * exp_avg + s.one_minus_beta1 * g;
  float v = s.beta2 * exp_avg_sq + s.one_minus_beta2 * g * g;
  float denom = sqrtf(v) / s.bias_correction2_sqrt + s.eps;
  exp_avg = m;
  exp_avg_sq = v;
  param = p - s.step_size * (m / denom);
}

}  // namespace tinyddp::kernels
