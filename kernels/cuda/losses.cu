// Kernels that reduce to a host number: softmax cross-entropy, MSE, accuracy and the sum of squares.
//
// Classification losses work row by row, one warp (32 threads) per row: the row's maximum and its
// softmax normaliser are warp reductions (register shuffles, no shared memory), and the gradient is
// written by the same warp in the same launch. Per-row losses then go through the deterministic
// two-stage sum of reduce_to_host.cuh.
#include <climits>
#include <math.h>

#include "tinyddp/kernels/cuda/cuda_kernels.h"
#include "tinyddp/kernels/cuda/reduce_to_host.cuh"

namespace tinyddp::kernels::cuda {

namespace {

using detail::kThreads;
using detail::kWarp;
constexpr int kRowsPerBlock = kThreads / kWarp;  // one warp per row

// The row this warp works on first, and the step to its next row (grid-stride over rows). Every lane
// of a warp sees the same row, so whole warps enter and leave the loop together, as the shuffles need.
__device__ inline int64_t first_row() { return int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp; }
__device__ inline int64_t row_stride() { return int64_t(gridDim.x) * kRowsPerBlock; }

// Labels outside [0, cols) are not an exception the GPU can throw: the smallest such row is recorded
// here (atomicMin, so the report does not depend on scheduling) and the host raises the error.
__device__ inline bool check_label(int64_t row, int64_t label, int64_t cols, unsigned long long* first_bad_row) {
  const bool ok = label >= 0 && label < cols;
  if (!ok && threadIdx.x % kWarp == 0) atomicMin(first_bad_row, (unsigned long long)row);
  return ok;
}

__global__ void __launch_bounds__(kThreads)
    softmax_cross_entropy_kernel(const float* logits, const int64_t* labels, float* dlogits, float* row_loss,
                                 int64_t rows, int64_t cols, float inv_batch, unsigned long long* first_bad_row) {
  const int lane = threadIdx.x % kWarp;
  for (int64_t row = first_row(); row < rows; row += row_stride()) {
    const float* x = logits + row * cols;
    const int64_t label = labels[row];
    const bool label_ok = check_label(row, label, cols, first_bad_row);
    // Read before the gradient loop, which may overwrite x when dlogits aliases logits.
    const float label_logit = label_ok ? x[label] : 0.f;

    float row_max = -INFINITY;
    for (int64_t j = lane; j < cols; j += kWarp) row_max = fmaxf(row_max, x[j]);
    row_max = detail::warp_max(row_max);
    float normaliser = 0.f;
    for (int64_t j = lane; j < cols; j += kWarp) normaliser += softmax_numerator(x[j], row_max);
    normaliser = detail::warp_sum(normaliser);

    if (dlogits) {
      float* d = dlogits + row * cols;
      const float inv_normaliser = 1.f / normaliser;
      for (int64_t j = lane; j < cols; j += kWarp)
        d[j] = cross_entropy_grad(softmax_numerator(x[j], row_max), inv_normaliser, j == label, inv_batch);
    }
    if (lane == 0) row_loss[row] = label_ok ? cross_entropy_row_loss(row_max, normaliser, label_logit) : 0.f;
  }
}

// argmax per row with ties going to the smallest index, as torch.argmax and the CPU loop do.
__global__ void __launch_bounds__(kThreads)
    count_correct_kernel(const float* logits, const int64_t* labels, int64_t rows, int64_t cols,
                         unsigned long long* correct, unsigned long long* first_bad_row) {
  const int lane = threadIdx.x % kWarp;
  for (int64_t row = first_row(); row < rows; row += row_stride()) {
    const float* x = logits + row * cols;
    const int64_t label = labels[row];
    const bool label_ok = check_label(row, label, cols, first_bad_row);
    // Each lane scans its columns in increasing order, keeping its first maximum; a lane with no
    // column at all holds (-inf, LLONG_MAX), which loses every comparison.
    float best = -INFINITY;
    long long best_index = LLONG_MAX;
    if (lane < cols) {
      best = x[lane];
      best_index = lane;
    }
    for (int64_t j = lane + kWarp; j < cols; j += kWarp)
      if (x[j] > best) {
        best = x[j];
        best_index = j;
      }
    for (int offset = kWarp / 2; offset > 0; offset /= 2) {
      const float other = __shfl_xor_sync(0xffffffffu, best, offset);
      const long long other_index = __shfl_xor_sync(0xffffffffu, best_index, offset);
      if (other > best || (other == best && other_index < best_index)) {
        best = other;
        best_index = other_index;
      }
    }
    // Integer atomics are exact and order-free, so the count is deterministic.
    if (lane == 0 && label_ok && best_index == label) atomicAdd(correct, 1ull);
  }
}

// The terms of the deterministic sums (see reduce_to_host.cuh).
struct RowValue {
  const float* values;
  __device__ double operator()(int64_t i) const { return double(values[i]); }
};
struct Square {
  const float* x;
  __device__ double operator()(int64_t i) const { return double(x[i]) * double(x[i]); }
};
struct SquaredErrorWithGrad {  // the MSE loss term, writing its gradient on the way when dpred is set
  const float* pred;
  const float* target;
  float* dpred;
  float two_over_n;
  __device__ double operator()(int64_t i) const {
    const float p = pred[i], t = target[i];
    if (dpred) dpred[i] = squared_error_grad(p, t, two_over_n);
    return double(squared_error(p, t));
  }
};

// Copies the first bad row (ULLONG_MAX when none) back as -1 or the row.
int64_t read_first_bad_row(const unsigned long long* device_value) {
  unsigned long long value = 0;
  CUDA_CHECK(cudaMemcpy(&value, device_value, sizeof(value), cudaMemcpyDeviceToHost));
  return value == ULLONG_MAX ? -1 : int64_t(value);
}

}  // namespace

double softmax_cross_entropy(int device, const float* logits, const int64_t* labels, float* dlogits, int64_t rows,
                             int64_t cols, int64_t* first_bad_row) {
  detail::use_device(device);
  // Scratch: the per-row losses, and the bad-row flag set to all ones.
  auto* row_loss = static_cast<float*>(
      detail::scratch(device, detail::Scratch::row_values, size_t(rows) * sizeof(float)));
  auto* bad_row = static_cast<unsigned long long*>(
      detail::scratch(device, detail::Scratch::counters, sizeof(unsigned long long)));
  CUDA_CHECK(cudaMemset(bad_row, 0xff, sizeof(unsigned long long)));
  softmax_cross_entropy_kernel<<<detail::blocks_for(rows, kRowsPerBlock), kThreads>>>(logits, labels, dlogits, row_loss,
                                                                                      rows, cols, 1.f / float(rows),
                                                                                      bad_row);
  CUDA_CHECK_LAUNCH();
  const double loss_sum = detail::sum_to_host(device, rows, RowValue{row_loss});
  *first_bad_row = read_first_bad_row(bad_row);
  return loss_sum / double(rows);
}

int64_t count_correct(int device, const float* logits, const int64_t* labels, int64_t rows, int64_t cols,
                      int64_t* first_bad_row) {
  detail::use_device(device);
  // [correct, first bad row]
  auto* counters = static_cast<unsigned long long*>(
      detail::scratch(device, detail::Scratch::counters, 2 * sizeof(unsigned long long)));
  CUDA_CHECK(cudaMemset(counters, 0, sizeof(unsigned long long)));
  CUDA_CHECK(cudaMemset(counters + 1, 0xff, sizeof(unsigned long long)));
  count_correct_kernel<<<detail::blocks_for(rows, kRowsPerBlock), kThreads>>>(logits, labels, rows, cols, counters,
                                                                              counters + 1);
  CUDA_CHECK_LAUNCH();
  unsigned long long correct = 0;
  CUDA_CHECK(cudaMemcpy(&correct, counters, sizeof(correct), cudaMemcpyDeviceToHost));
  *first_bad_row = read_first_bad_row(counters + 1);
  return int64_t(correct);
}

double mse(int device, const float* pred, const float* target, float* dpred, int64_t n) {
  return detail::sum_to_host(device, n, SquaredErrorWithGrad{pred, target, dpred, 2.f / float(n)}) / double(n);
}

double sum_of_squares(int device, const float* x, int64_t n) { return detail::sum_to_host(device, n, Square{x}); }

}  // namespace tinyddp::kernels::cuda
