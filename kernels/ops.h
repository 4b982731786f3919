// The kernels: every numeric operation the layers, losses and optimizers need, on CPU or CUDA
// tensors. Each function checks shapes, dtypes and devices at the top (and says which argument is
// wrong), then runs the CPU loop (kernels/*.cpp) or the CUDA kernel (kernels/cuda/*.cu). Both call
// the same per-element math from kernels/elementwise.h.
//
// Conventions:
//  - All float tensors are f32; labels are i64. All arguments of one call live on one device.
//  - Functions writing a gradient take `beta`: out = beta*out + new, so a layer can either overwrite
//    (beta = 0) or accumulate (beta = 1) as PyTorch's .grad does across backward passes.
#pragma once

#include <cstdint>
#include <string>

#include "tinyddp/core/tensor.h"

namespace tinyddp::kernels {

// ---- linear algebra ----------------------------------------------------------------------------
// c = alpha * op(a) @ op(b) + beta * c, op(x) = x or x^T; a, b, c are 2-D f32.
// CPU: oneDNN or OpenBLAS, whichever is faster on this CPU (kernels/cpu_gemm.h). CUDA: cublasSgemm.
// Mixed precision: a and b may both be bf16 or both f16 (c stays f32): the products of the narrow
// values, summed in f32 (kernels/mixed_gemm.h says which units do it where).
void gemm(const Tensor& a, bool transpose_a, const Tensor& b, bool transpose_b, Tensor& c, float alpha = 1.f,
          float beta = 0.f);
// Threads of the CPU GEMM libraries (1 = one thread per process, what DDP on CPU wants).
void set_cpu_threads(int threads);

// ---- mixed-precision GEMM operands (kernels/mixed_gemm.h) -----------------------------------------
// The dtype in which gemm() wants operands rounded to `narrow` (bf16 or f16) on `device`: `narrow`
// itself where the hardware multiplies it (GPUs, CPUs with bf16 units), else f32 holding the rounded
// values (the f32 GEMM then computes the same products: each is exact in f32).
DType mixed_operand_dtype(DType narrow, Device device);
// dst = src (f32) rounded to nearest even in `narrow`, stored in dst's dtype: `narrow`, or f32 holding
// the rounded values. Same element count, same device.
void round_to(const Tensor& src, DType narrow, Tensor& dst);
// The same rounding written twice from one read of src: narrow_dst in `narrow` itself (what a layer
// keeps for backward: half the bytes) and f32_dst holding the same values as f32 (the operand of an
// f32 GEMM). kernels/mixed_passes.cpp.
void round_to_both(const Tensor& src, DType narrow, Tensor& narrow_dst, Tensor& f32_dst);
// bias_grad(dy, dbias, beta) and round_to(dy, narrow, dy_rounded) in one pass over dy: bit for bit
// what the two calls write.
void bias_grad_and_round(const Tensor& dy, Tensor& dbias, float beta, DType narrow, Tensor& dy_rounded);
// Which units compute gemm() with `narrow` operands on `device`, and why, in words.
std::string mixed_gemm_units(DType narrow, Device device);

// ---- bias ----------------------------------------------------------------------------------------
// y[i, j] += bias[j] for y [rows, cols], bias [cols].
void bias_add(Tensor& y, const Tensor& bias);
// dbias[j] = beta * dbias[j] + sum_i dy[i, j].
void bias_grad(const Tensor& dy, Tensor& dbias, float beta = 0.f);

// ---- activations (any shape; out may alias in for forward) ---------------------------------------
void relu_forward(const Tensor& x, Tensor& y);
// dx = dy * (x > 0). dx may alias dy.
void relu_backward(const Tensor& x, const Tensor& dy, Tensor& dx);
// CPU: relu_forward that also writes mask (u8, x's shape) = 1 where x > 0, else 0 -- all that backward
// needs of x, exactly, in a quarter of its bytes -- and the backward that reads it: dx = mask ? dy : 0,
// bit for bit relu_backward's dx. dx may alias dy.
void relu_forward_masked(const Tensor& x, Tensor& y, Tensor& mask);
void relu_backward_masked(const Tensor& mask, const Tensor& dy, Tensor& dx);
// GELU, exact form x * Phi(x) (PyTorch's default approximate='none').
void gelu_forward(const Tensor& x, Tensor& y);
void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx);

// ---- losses --------------------------------------------------------------------------------------
// Fused softmax + cross-entropy, mean over the batch: logits [N, C] f32, labels [N] i64.
// Returns the loss. When dlogits is non-null it receives (softmax(logits) - onehot(labels)) / N,
// computed in the same pass (the probabilities are never stored separately).
// A label outside [0, C) is an error naming the row and the label.
float softmax_cross_entropy(const Tensor& logits, const Tensor& labels, Tensor* dlogits);
// Mean squared error over all elements; dpred (optional) receives 2 (pred - target) / numel.
float mse(const Tensor& pred, const Tensor& target, Tensor* dpred);
// Number of rows whose largest logit is at the label's index (ties: the first maximum, as argmax).
int64_t count_correct(const Tensor& logits, const Tensor& labels);

// ---- optimizers (one pass over a flat buffer; PyTorch's formulas) --------------------------------
struct SgdConfig {
  float lr = 1e-3f, momentum = 0.f, dampening = 0.f, weight_decay = 0.f;
  bool nesterov = false;
};
// torch.optim.SGD: g += wd*p; buf = first ? g : momentum*buf + (1-dampening)*g; g = nesterov ? g + momentum*buf : buf;
// p -= lr*g. momentum_buffer may be undefined when momentum == 0.
void sgd_step(Tensor& param, const Tensor& grad, Tensor& momentum_buffer, const SgdConfig& config, bool first_step);

// Doubles, as PyTorch's hyper-parameters are Python floats: the scalars derived from them (1 - beta,
// 1 - lr * wd, the bias corrections) are computed in double and only then rounded to f32, as PyTorch
// rounds them when it hands them to its f32 kernels. (float(1 - 0.9) is 0.1f; 1.f - 0.9f is not.)
struct AdamConfig {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  bool decoupled_weight_decay = false;  // true: AdamW (p *= 1 - lr*wd), false: Adam (g += wd*p)
};
// Throws unless `config` holds hyper-parameters torch.optim.Adam accepts (lr, eps, weight_decay >= 0,
// betas in [0, 1)). adam_step checks them too; nn::Adam checks once, when it is constructed.
void check_adam_config(const AdamConfig& config);
// torch.optim.Adam / AdamW with step counting from 1 (bias corrections 1 - beta^step).
void adam_step(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, const AdamConfig& config,
               int64_t step);

// ---- reductions and BLAS-1 -----------------------------------------------------------------------
// sum of x^2 in double precision (the global gradient norm is sqrt of the sum over all gradients).
double sum_of_squares(const Tensor& x);
void fill(Tensor& x, float value);
void scale(Tensor& x, float alpha);                  // x *= alpha
void axpy(float alpha, const Tensor& x, Tensor& y);  // y += alpha * x

// ---- dtype conversion ----------------------------------------------------------------------------
// dst = src element by element, rounded to nearest even where dst is narrower (core/half_precision.h):
// f32 -> bf16, bf16 -> f32, f32 -> f16, f16 -> f32 (and a plain copy when the dtypes agree). Same
// element count (shapes may differ, as for a flat bucket), same device. Unlike Tensor::to it writes
// into memory that already exists, which is what a gradient bucket's compressed copy wants.
void convert(const Tensor& src, Tensor& dst);

}  // namespace tinyddp::kernels
