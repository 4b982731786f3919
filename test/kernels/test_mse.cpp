// Mean squared error and its gradient against F.mse_loss and autograd.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "tinyddp/kernels/ops.h"
#include "kernel_fixtures.h"

using namespace tinyddp;
using namespace tinyddp::testing;

TEST_CASE("mse: loss and gradient match PyTorch") {
  SafetensorsFile f = kernel_fixture("mse");
  Tensor dpred = Tensor::empty(f.get("pred").shape());
  float loss = kernels::mse(f.get("pred"), f.get("target"), &dpred);
  check_close({loss}, {f.get("loss").item<float>()}, 1e-6, 1e-6, "mse loss");
  check_close(dpred, f.get("dpred"), 1e-7, 1e-5, "mse dpred");
  CHECK(kernels::mse(f.get("pred"), f.get("target"), nullptr) == loss);
}

TEST_CASE("mse over many elements: a closed form") {
  // pred - target = 1 on the first half and -3 on the second: mean = (1 + 9) / 2 = 5 exactly, and the
  // length is not a multiple of the 8 summation lanes.
  const int64_t n = 2 * 1003;
  std::vector<float> pred(static_cast<size_t>(n), 0.f), target(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) target[size_t(i)] = i < n / 2 ? -1.f : 3.f;
  Tensor d = Tensor::empty({n});
  CHECK(kernels::mse(Tensor::from_vector(pred), Tensor::from_vector(target), &d) == 5.f);
  // Every element's gradient is 2 (pred - target) / n: 2/n on the first half, -6/n on the second. The
  // float result rounds twice (2/n, then the product with pred - target, itself exact here), so it is
  // within (1 + u)^2 - 1 < 3u of the exact value, u = 2^-24.
  const std::vector<float> got = d.to_vector<float>();
  int64_t outside = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double exact = (i < n / 2 ? 2.0 : -6.0) / double(n);
    if (!(std::fabs(double(got[size_t(i)]) - exact) <= 3 * 0x1p-24 * std::fabs(exact))) {
      if (outside++ == 0) FAIL_CHECK("dpred[" << i << "] = " << got[size_t(i)] << ", exactly " << exact);
    }
  }
  CHECK(outside == 0);
}

TEST_CASE("mse refuses a target of another shape") {
  CHECK_THROWS_WITH_AS(kernels::mse(Tensor::zeros({2, 3}), Tensor::zeros({6}), nullptr),
                       doctest::Contains("argument `target` is f32[6] on cpu but `pred` is f32[2, 3]"), Error);
}
