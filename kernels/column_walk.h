// The index arithmetic of the bias kernels, written once for the CPU tests and the CUDA kernels
// (kernels/cuda/elementwise.cu), as the element functions are (elementwise.h).
#pragma once

#include <stdint.h>

#include "tinyddp/core/hd.h"

namespace tinyddp::kernels {

// The column of element i of a row-major [rows, cols] matrix, i % cols, followed along a grid-stride
// loop (i, i + stride, i + 2 stride, ...) with an add and a compare per step: a 64-bit `%` per element
// costs tens of instructions on a GPU, more than the add it indexes for.
struct ColumnWalk {
  int64_t column, step, columns;
  TINYDDP_HD ColumnWalk(int64_t first, int64_t stride, int64_t cols)
      : column(first % cols), step(stride % cols), columns(cols) {}
  TINYDDP_HD void advance() {
    column += step;
    if (column >= columns) column -= columns;
  }
};

// bias_grad's split of the rows among blocks. A block sums 32 columns; with few columns (a 10-class
// output layer: one block) the rows are also cut into chunks, one block each, whose partial sums a
// second kernel adds in chunk order (deterministic, no atomics). Chunks of at least kBiasRowsPerChunk
// rows, and no more blocks than kBiasTargetBlocks in all: enough to fill any current GPU.
constexpr int64_t kBiasRowsPerChunk = 1024;
constexpr int64_t kBiasTargetBlocks = 1024;
TINYDDP_HD int64_t bias_grad_row_chunks(int64_t rows, int64_t column_blocks) {
  if (column_blocks >= kBiasTargetBlocks) return 1;
  const int64_t by_rows = (rows + kBiasRowsPerChunk - 1) / kBiasRowsPerChunk;
  const int64_t by_blocks = kBiasTargetBlocks / column_blocks;
  const int64_t chunks = by_rows < by_blocks ? by_rows : by_blocks;
  return chunks < 1 ? 1 : chunks;
}
// Rows per chunk: every chunk holds at least one row.
TINYDDP_HD int64_t bias_grad_rows_per_chunk(int64_t rows, int64_t chunks) { return (rows + chunks - 1) / chunks; }

}  // namespace tinyddp::kernels
