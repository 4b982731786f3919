// The element-wise CUDA kernels: activations, bias, fill/scale/axpy. Each is a grid-stride loop
// around the same kernels/elementwise.h function the CPU loop calls.
#include "tinyddp/kernels/column_walk.h"
#include "tinyddp/kernels/cuda/cuda_kernels.h"
#include "tinyddp/kernels/cuda/launch.cuh"
#include "tinyddp/kernels/cuda/scratch.h"

namespace tinyddp::kernels::cuda {

namespace {

using detail::first_index;
using detail::grid_stride;
using detail::kThreads;

// The four activation functions as functors, so one kernel template serves them all.
struct Relu {
  __device__ float operator()(float x) const { return relu(x); }
};
struct ReluGrad {
  __device__ float operator()(float x, float dy) const { return relu_grad(x, dy); }
};
struct Gelu {
  __device__ float operator()(float x) const { return gelu(x); }
};
struct GeluGrad {
  __device__ float operator()(float x, float dy) const { return gelu_grad(x, dy); }
};

// y may alias x (and dx may alias dy): every element is read, then written, by one thread.
template <typename Fn>
__global__ void map_kernel(const float* x, float* y, int64_t n, Fn fn) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] = fn(x[i]);
}
template <typename Fn>
__global__ void map2_kernel(const float* x, const float* dy, float* dx, int64_t n, Fn fn) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) dx[i] = fn(x[i], dy[i]);
}

template <typename Fn>
void launch_map(int device, const float* x, float* y, int64_t n, Fn fn) {
  if (n == 0) return;
  detail::use_device(device);
  map_kernel<<<detail::blocks_for(n), kThreads>>>(x, y, n, fn);
  CUDA_CHECK_LAUNCH();
}
template <typename Fn>
void launch_map2(int device, const float* x, const float* dy, float* dx, int64_t n, Fn fn) {
  if (n == 0) return;
  detail::use_device(device);
  map2_kernel<<<detail::blocks_for(n), kThreads>>>(x, dy, dx, n, fn);
  CUDA_CHECK_LAUNCH();
}

__global__ void bias_add_kernel(float* y, const float* bias, int64_t n, int64_t cols) {
  ColumnWalk walk(first_index(), grid_stride(), cols);
  for (int64_t i = first_index(); i < n; i += grid_stride(), walk.advance()) y[i] += bias[walk.column];
}

// Column sums of dy [rows, cols]. A block owns 32 consecutive columns of one chunk of rows
// (blockIdx.y; column_walk.h says how the rows are cut): its 32 x 8 threads read rows in coalesced
// 32-float segments, each of the 8 thread rows summing every 8th row of the chunk, then the 8 partial
// sums of a column are added in a fixed order (deterministic, no atomics). One chunk: the sum goes
// into dbias; several: into partials[chunk][col], which bias_grad_combine_kernel adds in chunk order.
constexpr int kBiasRowsPerPass = kThreads / detail::kWarp;  // 8
__global__ void bias_grad_kernel(const float* dy, float* dbias, float* partials, int64_t rows, int64_t cols,
                                 int64_t rows_per_chunk, float beta) {
  __shared__ float partial[kBiasRowsPerPass][detail::kWarp];
  const int64_t col = int64_t(blockIdx.x) * detail::kWarp + threadIdx.x;
  const int64_t begin = int64_t(blockIdx.y) * rows_per_chunk;
  const int64_t end = begin + rows_per_chunk < rows ? begin + rows_per_chunk : rows;
  float sum = 0.f;
  if (col < cols)
    for (int64_t i = begin + threadIdx.y; i < end; i += kBiasRowsPerPass) sum += dy[i * cols + col];
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float total = 0.f;
    for (int r = 0; r < kBiasRowsPerPass; ++r) total += partial[r][threadIdx.x];
    if (partials != nullptr)
      partials[int64_t(blockIdx.y) * cols + col] = total;
    else
      dbias[col] = accumulate(beta, dbias[col], total);
  }
}

__global__ void bias_grad_combine_kernel(const float* partials, float* dbias, int64_t chunks, int64_t cols,
                                         float beta) {
  for (int64_t col = first_index(); col < cols; col += grid_stride()) {
    float total = 0.f;
    for (int64_t c = 0; c < chunks; ++c) total += partials[c * cols + col];
    dbias[col] = accumulate(beta, dbias[col], total);
  }
}

__global__ void fill_kernel(float* x, int64_t n, float value) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) x[i] = value;
}
__global__ void scale_kernel(float* x, int64_t n, float alpha) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) x[i] = scale_element(alpha, x[i]);
}
__global__ void axpy_kernel(float alpha, const float* x, float* y, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] = axpy_element(alpha, x[i], y[i]);
}

}  // namespace

void relu_forward(int device, const float* x, float* y, int64_t n) { launch_map(device, x, y, n, Relu{}); }
void relu_backward(int device, const float* x, const float* dy, float* dx, int64_t n) {
  launch_map2(device, x, dy, dx, n, ReluGrad{});
}
void gelu_forward(int device, const float* x, float* y, int64_t n) { launch_map(device, x, y, n, Gelu{}); }
void gelu_backward(int device, const float* x, const float* dy, float* dx, int64_t n) {
  launch_map2(device, x, dy, dx, n, GeluGrad{});
}

void bias_add(int device, float* y, const float* bias, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  if (n == 0) return;
  detail::use_device(device);
  bias_add_kernel<<<detail::blocks_for(n), kThreads>>>(y, bias, n, cols);
  CUDA_CHECK_LAUNCH();
}

void bias_grad(int device, const float* dy, float* dbias, int64_t rows, int64_t cols, float beta) {
  if (cols == 0) return;
  detail::use_device(device);
  const int64_t blocks = (cols + detail::kWarp - 1) / detail::kWarp;  // one block per 32 columns
  TINYDDP_CHECK(blocks <= 0x7fffffff, "bias_grad: ", cols, " columns exceed one CUDA grid", hint("split the bias"));
  const int64_t chunks = bias_grad_row_chunks(rows, blocks);  // at most kBiasTargetBlocks: fits grid.y
  const int64_t rows_per_chunk = bias_grad_rows_per_chunk(rows, chunks);
  float* partials = chunks > 1 ? static_cast<float*>(detail::scratch(device, detail::Scratch::bias_partials,
                                                                     size_t(chunks * cols) * sizeof(float)))
                               : nullptr;
  const dim3 grid{unsigned(blocks), unsigned(chunks)};
  bias_grad_kernel<<<grid, dim3(detail::kWarp, kBiasRowsPerPass)>>>(dy, dbias, partials, rows, cols, rows_per_chunk,
                                                                    beta);
  CUDA_CHECK_LAUNCH();
  if (partials == nullptr) return;
  // The same stream: the combine runs after every chunk's sum is written.
  bias_grad_combine_kernel<<<detail::blocks_for(cols), kThreads>>>(partials, dbias, chunks, cols, beta);
  CUDA_CHECK_LAUNCH();
}

void fill(int device, float* x, int64_t n, float value) {
  if (n == 0) return;
  detail::use_device(device);
  fill_kernel<<<detail::blocks_for(n), kThreads>>>(x, n, value);
  CUDA_CHECK_LAUNCH();
}

void scale(int device, float* x, int64_t n, float alpha) {
  if (n == 0) return;
  detail::use_device(device);
  scale_kernel<<<detail::blocks_for(n), kThreads>>>(x, n, alpha);
  CUDA_CHECK_LAUNCH();
}

void axpy(int device, float alpha, const float* x, float* y, int64_t n) {
  if (n == 0) return;
  detail::use_device(device);
  axpy_kernel<<<detail::blocks_for(n), kThreads>>>(alpha, x, y, n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace tinyddp::kernels::cuda
