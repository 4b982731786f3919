// The seed's DummyDataset: n samples of 10 uniform [0, 1) features; the label is 1 when their mean is
// above 0.5, else 0. Drawn from the Philox generator, so every process (and every device) builds the
// same data for one seed without sending it anywhere.
#pragma once

#include <memory>

#include "tinyddp/core/random.h"
#include "tinyddp/nn/data/dataset.h"

namespace tinyddp::examples {

inline std::shared_ptr<nn::TensorDataset> make_dummy_dataset(int64_t n, int64_t features, uint64_t seed) {
  Generator gen(seed);
  Tensor x = Tensor::empty({n, features});
  fill_uniform(x, 0.f, 1.f, gen);
  Tensor y = Tensor::empty({n}, DType::i64);
  const float* px = x.data<float>();
  int64_t* py = y.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    double sum = 0;
    for (int64_t j = 0; j < features; ++j) sum += px[i * features + j];
    py[i] = sum / double(features) > 0.5 ? 1 : 0;
  }
  return std::make_shared<nn::TensorDataset>(x, y);
}

}  // namespace tinyddp::examples
