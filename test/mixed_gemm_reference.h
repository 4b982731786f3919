// The reference a mixed-precision GEMM is checked against: its operands rounded to bf16 or f16 by
// core/half_precision.h's functions, their product taken in double (every product of two narrow
// values is exact; every sum is good to 2^-53). Shared by the kernels and nn suites.
#pragma once

#include <vector>

#include "tinyddp/core/half_precision.h"
#include "tinyddp/core/tensor.h"

namespace tinyddp::testing {

inline float rounded_to(float x, DType narrow) {
  return narrow == DType::bf16 ? f32_from_bf16_bits(bf16_bits_from_f32(x)) : f32_from_f16_bits(f16_bits_from_f32(x));
}

// `t` (f32) with every element rounded to `narrow`, kept as f32.
inline Tensor reference_rounding(const Tensor& t, DType narrow) {
  std::vector<float> v = t.to(Device::cpu()).to_vector<float>();
  for (float& x : v) x = rounded_to(x, narrow);
  return Tensor::from_vector(v, t.shape());
}

// op(a) op(b) + beta c0 in double, row-major; c0 holds m x n values, or n (one per column, a bias).
inline std::vector<double> exact_product(const Tensor& a, bool ta, const Tensor& b, bool tb, double beta = 0,
                                         const std::vector<float>& c0 = {}) {
  const int64_t m = ta ? a.size(1) : a.size(0), k = ta ? a.size(0) : a.size(1), n = tb ? b.size(0) : b.size(1);
  const std::vector<float> va = a.to_vector<float>(), vb = b.to_vector<float>();
  std::vector<double> c(size_t(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0;
      for (int64_t l = 0; l < k; ++l)
        sum += double(va[size_t(ta ? l * m + i : i * k + l)]) * double(vb[size_t(tb ? j * k + l : l * n + j)]);
      const size_t at = size_t(i * n + j), c0_at = c0.size() == size_t(n) ? size_t(j) : at;
      c[at] = sum + (beta != 0 ? beta * double(c0[c0_at]) : 0.0);
    }
  return c;
}

}  // namespace tinyddp::testing
