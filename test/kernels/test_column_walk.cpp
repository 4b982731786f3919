// The bias kernels' index arithmetic (kernels/column_walk.h), which the CUDA kernels run as written:
// the column walk equals i % cols along every grid-stride loop, and bias_grad's row chunks cover every
// row once, each chunk non-empty, with as many blocks as the rule says.
#include <doctest/doctest.h>

#include <algorithm>
#include <vector>

#include "tinyddp/kernels/column_walk.h"

using namespace tinyddp::kernels;

TEST_CASE("ColumnWalk follows i % cols along a grid-stride loop") {
  for (int64_t cols : {1, 2, 3, 10, 31, 32, 33, 1000, 5000}) {
    for (int64_t stride : {1, 7, 256, 4096 * 256}) {
      const int64_t n = 3 * stride + 2 * cols + 5;
      for (int64_t first : {int64_t(0), int64_t(1), stride / 2, stride - 1}) {
        ColumnWalk walk(first, stride, cols);
        int64_t wrong = 0;
        for (int64_t i = first; i < n; i += stride, walk.advance()) wrong += walk.column != i % cols;
        CHECK_MESSAGE(wrong == 0, "cols ", cols, " stride ", stride, " first ", first);
      }
    }
  }
}

TEST_CASE("bias_grad's row chunks: a 10-class layer gets several blocks, wide layers one chunk") {
  CHECK(bias_grad_row_chunks(32, 1) == 1);    // a small batch: one block is enough
  CHECK(bias_grad_row_chunks(4096, 1) == 4);  // 10 classes, batch 4096: four blocks, not one
  CHECK(bias_grad_row_chunks(int64_t(1) << 24, 1) == kBiasTargetBlocks);  // capped (and within grid.y)
  CHECK(bias_grad_row_chunks(int64_t(1) << 24, 4) == kBiasTargetBlocks / 4);
  CHECK(bias_grad_row_chunks(int64_t(1) << 24, 2000) == 1);  // enough column blocks already
  CHECK(bias_grad_row_chunks(0, 1) == 1);
  for (int64_t rows : {1, 7, 1023, 1024, 1025, 4097, 100000, 1234567}) {
    for (int64_t column_blocks : {1, 3, 32, 1000}) {
      const int64_t chunks = bias_grad_row_chunks(rows, column_blocks);
      const int64_t per = bias_grad_rows_per_chunk(rows, chunks);
      CHECK(chunks >= 1);
      CHECK(chunks * column_blocks <= std::max<int64_t>(kBiasTargetBlocks, column_blocks));
      // Every row in exactly one chunk [c * per, min(rows, (c + 1) * per)), none empty.
      std::vector<int> seen(size_t(rows), 0);
      for (int64_t c = 0; c < chunks; ++c) {
        const int64_t begin = c * per, end = std::min(rows, begin + per);
        CHECK(begin < end);
        for (int64_t i = begin; i < end; ++i) ++seen[size_t(i)];
      }
      CHECK(std::count(seen.begin(), seen.end(), 1) == rows);
    }
  }
}
