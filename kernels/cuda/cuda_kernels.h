// The CUDA side of kernels/ops.h: one host function per kernel, taking raw device pointers and the
// CUDA ordinal. They live in the CUDA half (libtinyddp_cuda.so, see core/cuda_plugin.h), which hands
// them out as one table, Kernels, below; the ops.h functions check their tensors, then call through
// it (kernels/cuda_dispatch.h). Everything here is launched on the device's default stream, in order
// with every other kernel and copy of tinyddp on that device. Functions that return a host value
// (losses, reductions) wait for their kernels before returning.
#pragma once

#include <cstdint>

#include "tinyddp/core/dtype.h"
#include "tinyddp/kernels/elementwise.h"

namespace tinyddp::kernels::cuda {

// Row-major c[m, n] = alpha * op(a) @ op(b) + beta * c through cuBLAS; lda/ldb/ldc are the row
// lengths of a, b and c as stored.
void gemm(int device, bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// The same with bf16 or f16 operands (`operands`) and an f32 c: cublasGemmEx with CUDA_R_16BF or
// CUDA_R_16F inputs and CUBLAS_COMPUTE_32F (tensor cores, products summed in f32).
void gemm_mixed(int device, bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
                const void* a, int64_t lda, const void* b, int64_t ldb, DType operands, float beta, float* c,
                int64_t ldc);

void bias_add(int device, float* y, const float* bias, int64_t rows, int64_t cols);
void bias_grad(int device, const float* dy, float* dbias, int64_t rows, int64_t cols, float beta);

void relu_forward(int device, const float* x, float* y, int64_t n);
void relu_backward(int device, const float* x, const float* dy, float* dx, int64_t n);
void gelu_forward(int device, const float* x, float* y, int64_t n);
void gelu_backward(int device, const float* x, const float* dy, float* dx, int64_t n);

// Mean softmax cross-entropy over `rows` rows; dlogits may be null. Labels are validated on the
// device: *first_bad_row receives the smallest row whose label is outside [0, cols), or -1. When it is
// not -1 the returned loss and dlogits are meaningless and the caller raises the error.
double softmax_cross_entropy(int device, const float* logits, const int64_t* labels, float* dlogits, int64_t rows,
                             int64_t cols, int64_t* first_bad_row);
// Mean of (pred - target)^2; dpred (optional) receives 2 (pred - target) / n in the same pass.
double mse(int device, const float* pred, const float* target, float* dpred, int64_t n);
// Rows whose first maximum is at the label; labels validated as in softmax_cross_entropy.
int64_t count_correct(int device, const float* logits, const int64_t* labels, int64_t rows, int64_t cols,
                      int64_t* first_bad_row);

// momentum_buffer may be null when s.momentum == 0.
void sgd_step(int device, float* param, const float* grad, float* momentum_buffer, int64_t n, const SgdScalars& s);
void adam_step(int device, float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
               const AdamScalars& s);

double sum_of_squares(int device, const float* x, int64_t n);
void fill(int device, float* x, int64_t n, float value);
void scale(int device, float* x, int64_t n, float alpha);
void axpy(int device, float alpha, const float* x, float* y, int64_t n);

// dst = src converted element by element: f32 <-> bf16, f32 <-> f16 (core/half_precision.h).
void convert(int device, const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n);

// The functions above, as the CUDA half hands them out: the rest of tinyddp calls them only through
// this table, so it links nothing of CUDA. (Members are declared with the functions' own types.)
struct Kernels {
  decltype(&cuda::gemm) gemm;
  decltype(&cuda::gemm_mixed) gemm_mixed;
  decltype(&cuda::bias_add) bias_add;
  decltype(&cuda::bias_grad) bias_grad;
  decltype(&cuda::relu_forward) relu_forward;
  decltype(&cuda::relu_backward) relu_backward;
  decltype(&cuda::gelu_forward) gelu_forward;
  decltype(&cuda::gelu_backward) gelu_backward;
  decltype(&cuda::softmax_cross_entropy) softmax_cross_entropy;
  decltype(&cuda::mse) mse;
  decltype(&cuda::count_correct) count_correct;
  decltype(&cuda::sgd_step) sgd_step;
  decltype(&cuda::adam_step) adam_step;
  decltype(&cuda::sum_of_squares) sum_of_squares;
  decltype(&cuda::fill) fill;
  decltype(&cuda::scale) scale;
  decltype(&cuda::axpy) axpy;
  decltype(&cuda::convert) convert;
};

// libtinyddp_cuda.so's entry point for the table (core/cuda_plugin.h's cuda_half_interface).
constexpr const char* kKernelsEntryName = "tinyddp_cuda_kernels";

}  // namespace tinyddp::kernels::cuda
