// Shared by the Trainer suites: a small classification problem, a Trainer subclass for it, and a
// temporary directory.
#pragma once

#include <doctest/doctest.h>
#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "tinyddp/core/random.h"
#include "tinyddp/kernels/ops.h"
#include "tinyddp/nn/activations.h"
#include "tinyddp/nn/data/data_loader.h"
#include "tinyddp/nn/data/dataset.h"
#include "tinyddp/nn/linear.h"
#include "tinyddp/nn/loss.h"
#include "tinyddp/nn/optim/adam.h"
#include "tinyddp/nn/optim/schedulers.h"
#include "tinyddp/nn/sequential.h"
#include "tinyddp/nn/train/trainer.h"
#include "test/test_support.h"

namespace tinyddp::testing {

// Rounds every element to the nearest multiple of 1/64.
inline void round_to_64ths(Tensor& t) {
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = std::nearbyint(p[i] * 64.f) / 64.f;
}

// n samples of 6 uniform features; the label is the index of the largest of three fixed sums, so a
// 6-8-3 MLP can learn it. With `on_grid`, the features are multiples of 1/64 (see exact_forward).
inline std::shared_ptr<nn::TensorDataset> three_class_data(int64_t n, uint64_t seed, bool on_grid = false) {
  Generator gen(seed);
  Tensor x = Tensor::empty({n, 6});
  fill_uniform(x, -1.f, 1.f, gen);
  if (on_grid) round_to_64ths(x);
  Tensor y = Tensor::empty({n}, DType::i64);
  const float* px = x.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    const float* r = px + i * 6;
    float s[3] = {r[0] + r[1] - r[2], r[2] + r[3] - r[4], r[4] + r[5] - r[0]};
    y.data<int64_t>()[i] = s[0] >= s[1] && s[0] >= s[2] ? 0 : (s[1] >= s[2] ? 1 : 2);
  }
  return std::make_shared<nn::TensorDataset>(x, y);
}

inline std::unique_ptr<nn::Sequential> small_mlp(uint64_t seed) {
  Generator gen(seed);
  auto model = std::make_unique<nn::Sequential>();
  model->emplace<nn::Linear>(6, 8, gen);
  model->emplace<nn::ReLU>();
  model->emplace<nn::Linear>(8, 3, gen);
  return model;
}

// Makes small_mlp's forward pass exact in float, so that every way of computing it -- any GEMM library,
// ISA, thread count, or number of rows per product -- gives the same bits: its weights and biases
// rounded to multiples of 1/64 (they lie within 1/sqrt(6) of 0: at most 26/64), fed features on the
// same grid (three_class_data with on_grid; |x| <= 1). The first layer's products and partial sums
// are then multiples of 2^-12 below 6 * 64 * 26 * 2^-12 + 26/64 < 3 in magnitude, its outputs need
// at most 14 significant bits; the second layer's (weights at most 23/64 from 1/sqrt(8)) are multiples
// of 2^-18 below 9 * 3 * 23/64 < 10, at most 22 bits. A float holds 24: no product or sum rounds.
inline void exact_forward(nn::Module& model) {
  for (nn::Parameter* p : model.parameters()) round_to_64ths(p->value);
}

// The seed's user subclass: train_step and test_step return the loss (and the accuracy), which is
// what nn::ClassifierTrainer does.
using MlpTrainer = nn::ClassifierTrainer;

// Everything one training run needs, built the same way from the same seeds every time.
struct Setup {
  std::unique_ptr<nn::Sequential> model;
  std::unique_ptr<nn::Adam> optimizer;
  std::unique_ptr<nn::CosineAnnealing> scheduler;

  explicit Setup(uint64_t model_seed = 7, double lr = 1e-2, int64_t total_iters = 40) {
    model = small_mlp(model_seed);
    optimizer = std::make_unique<nn::Adam>(model->named_parameters(), lr);
    scheduler = std::make_unique<nn::CosineAnnealing>(*optimizer, total_iters);
  }
};

using tinyddp::testing::TempDir;

inline std::vector<float> flat_weights(nn::Module& model) {
  std::vector<float> out;
  for (const nn::NamedParameter& p : model.named_parameters()) {
    std::vector<float> v = p.parameter->value.to_vector<float>();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

}  // namespace tinyddp::testing
