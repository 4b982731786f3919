// The column sums of a row-major [rows, cols] f32 matrix on the CPU, as a bias gradient wants them:
// out[j] = beta * out[j] + sum_i in[i, j]. One loop for bias_grad (kernels/bias.cpp) and for the passes
// that read the same dy for something else as well (kernels/mixed_passes.cpp): their sums must be
// the same bits, so they must be the same additions in the same order. Internal to kernels/*.cpp.
#pragma once

#include <cstdint>

#include "tinyddp/kernels/elementwise.h"

namespace tinyddp::kernels::detail {

// Columns in blocks that fit a small stack buffer: the sum of a block is accumulated row after row
// (contiguous loads, one vectorised add per row), then combined with the old gradient once, so
// beta * old is added to the finished sum as PyTorch's grad accumulation does. After each row of a
// block is summed, visit_row(row, i, j0, width) sees the same values while they are still in L1:
// row points at in[i, j0], width of them.
template <typename VisitRow>
__attribute__((always_inline)) inline void cpu_column_sums(const float* __restrict in, float* __restrict out,
                                                           float beta, int64_t rows, int64_t cols, VisitRow visit_row) {
  constexpr int64_t kBlock = 512;
  float sums[kBlock];
  for (int64_t j0 = 0; j0 < cols; j0 += kBlock) {
    const int64_t width = cols - j0 < kBlock ? cols - j0 : kBlock;
    for (int64_t j = 0; j < width; ++j) sums[j] = 0.f;
    for (int64_t i = 0; i < rows; ++i) {
      const float* __restrict row = in + i * cols + j0;
      for (int64_t j = 0; j < width; ++j) sums[j] += row[j];
      visit_row(row, i, j0, width);
    }
    for (int64_t j = 0; j < width; ++j) out[j0 + j] = accumulate(beta, out[j0 + j], sums[j]);
  }
}

}  // namespace tinyddp::kernels::detail
