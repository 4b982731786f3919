// Helpers of the kernels suite: the PyTorch reference files written by test/fixtures/make_kernels.py.
#pragma once

#include <string>

#include "tinyddp/core/safetensors.h"
#include "test/test_support.h"

namespace tinyddp::testing {

// kernels_<topic>.safetensors, loaded once per call (the files are a few KB).
inline SafetensorsFile kernel_fixture(const std::string& topic) {
  return load_safetensors(fixture("kernels_" + topic + ".safetensors"));
}

// The transpose of a 2-D f32 CPU tensor, as a new contiguous tensor (for feeding gemm its transposed
// operand layouts; moving elements is not the arithmetic under test).
inline Tensor transposed(const Tensor& t) {
  const int64_t rows = t.size(0), cols = t.size(1);
  Tensor out = Tensor::empty({cols, rows});
  const float* in = t.data<float>();
  float* o = out.data<float>();
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) o[j * rows + i] = in[i * cols + j];
  return out;
}

}  // namespace tinyddp::testing
