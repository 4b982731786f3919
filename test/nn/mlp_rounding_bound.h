// How far a float32 forward pass through Linear and ReLU layers can lie from the exact one, element by
// element, whatever order its GEMMs add their products in (another library, ISA, thread count, or
// PyTorch): for comparing two such computations with a tolerance derived from the computation.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "tinyddp/nn/activations.h"
#include "tinyddp/nn/linear.h"
#include "tinyddp/nn/sequential.h"
#include "test/test_support.h"

namespace tinyddp::testing {

// For each output element of model.forward(x), a bound on |computed - exact|. Layer by layer: a
// Linear output y_j = b_j + sum_k W_jk h_k computed from inputs h_k that are within e_k of exact lies
// within gamma(in + 2) (|b_j| + sum_k |W_jk| (|h_k| + e_k)) + sum_k |W_jk| e_k of exact (its own
// rounding, gemm_rounding_bound's, plus the inputs' errors carried through); a ReLU passes the
// errors on, never growing them. The magnitudes |h_k| come from the exact pass, run in double
// (its own error, 2^29 times smaller than float's, is inside the bound's slack).
inline std::vector<double> mlp_forward_bound(nn::Sequential& model, const Tensor& x) {
  const int64_t rows = x.size(0);
  int64_t width = x.size(1);
  const std::vector<float> input = x.to_vector<float>();
  std::vector<double> value(input.begin(), input.end()), error(value.size(), 0.0);
  for (auto& layer : model) {
    if (dynamic_cast<nn::ReLU*>(layer.get()) != nullptr) {
      for (double& v : value) v = std::max(v, 0.0);
      continue;
    }
    auto* linear = dynamic_cast<nn::Linear*>(layer.get());
    REQUIRE_MESSAGE(linear != nullptr, "mlp_forward_bound knows Linear and ReLU, not " << layer->describe());
    const int64_t out = linear->out_features();
    const std::vector<float> w = linear->weight().value.to_vector<float>();
    const std::vector<float> b = linear->has_bias() ? linear->bias().value.to_vector<float>()
                                                    : std::vector<float>(size_t(out), 0.f);
    std::vector<double> next_value(size_t(rows * out)), next_error(size_t(rows * out));
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < out; ++j) {
        double sum = b[size_t(j)], magnitude = std::fabs(double(b[size_t(j)])), carried = 0;
        for (int64_t k = 0; k < width; ++k) {
          const double wk = w[size_t(j * width + k)], h = value[size_t(i * width + k)],
                       e = error[size_t(i * width + k)];
          sum += wk * h;
          magnitude += std::fabs(wk) * (std::fabs(h) + e);
          carried += std::fabs(wk) * e;
        }
        next_value[size_t(i * out + j)] = sum;
        next_error[size_t(i * out + j)] = gamma_n(width + 2) * magnitude + carried;
      }
    value = std::move(next_value);
    error = std::move(next_error);
    width = out;
  }
  return error;
}

}  // namespace tinyddp::testing
