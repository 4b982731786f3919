// ReLU and exact GELU, forward and backward, against torch.relu / F.gelu and autograd, on inputs
// that include +-0, tiny values and large |x| (where erf saturates and exp(-x^2/2) underflows).
#include <doctest/doctest.h>

#include <limits>
#include <vector>

#include "tinyddp/kernels/ops.h"
#include "kernel_fixtures.h"

using namespace tinyddp;
using namespace tinyddp::testing;

TEST_CASE("relu forward and backward match PyTorch, including x = 0") {
  SafetensorsFile f = kernel_fixture("activations");
  const Tensor& x = f.get("x");
  Tensor y = Tensor::empty(x.shape()), dx = Tensor::empty(x.shape());
  kernels::relu_forward(x, y);
  check_close(y, f.get("relu_y"), 0, 0, "relu(x)");
  kernels::relu_backward(x, f.get("dy"), dx);
  check_close(dx, f.get("relu_dx"), 0, 0, "relu'(x) dy");
}

TEST_CASE("relu with a u8 mask matches PyTorch too, and the mask is x > 0, in dx bit for bit relu_backward's") {
  SafetensorsFile f = kernel_fixture("activations");
  std::vector<float> values = f.get("x").to_vector<float>();
  const float tiny = std::numeric_limits<float>::denorm_min(), nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> corners = {0.f, -0.f, tiny, -tiny, nan, -nan};
  const size_t fixture_size = values.size();
  values.insert(values.end(), corners.begin(), corners.end());
  const Tensor x = Tensor::from_vector(values);
  std::vector<float> dyv = f.get("dy").to_vector<float>();
  dyv.insert(dyv.end(), {1.f, 2.f, 3.f, 4.f, 5.f, 6.f});
  const Tensor dy = Tensor::from_vector(dyv);
  Tensor y = Tensor::empty(x.shape()), mask = Tensor::empty(x.shape(), DType::u8);
  Tensor dx = Tensor::empty(x.shape()), dx_plain = Tensor::empty(x.shape());
  kernels::relu_forward_masked(x, y, mask);
  kernels::relu_backward_masked(mask, dy, dx);
  kernels::relu_backward(x, dy, dx_plain);
  check_close(y.view(0, {int64_t(fixture_size)}), f.get("relu_y").view(0, {int64_t(fixture_size)}), 0, 0, "relu(x)");
  check_close(dx.view(0, {int64_t(fixture_size)}), f.get("relu_dx").view(0, {int64_t(fixture_size)}), 0, 0,
              "relu'(x) dy");
  CHECK(bitwise_equal(dx, dx_plain));
  for (size_t i = 0; i < values.size(); ++i) CHECK(mask.data<uint8_t>()[i] == (values[i] > 0.f ? 1 : 0));
  CHECK(dx.data<float>()[fixture_size + 2] == 3.f);    // the smallest subnormal is > 0: its gradient passes
  CHECK(mask.data<uint8_t>()[fixture_size + 4] == 0);  // NaN > 0 is false
  Tensor wrong = Tensor::empty(x.shape());
  CHECK_THROWS_WITH_AS(kernels::relu_forward_masked(x, y, wrong), doctest::Contains("must be u8"), Error);
}

TEST_CASE("gelu forward and backward match PyTorch's exact GELU") {
  SafetensorsFile f = kernel_fixture("activations");
  const Tensor& x = f.get("x");
  Tensor y = Tensor::empty(x.shape()), dx = Tensor::empty(x.shape());
  kernels::gelu_forward(x, y);
  check_close(y, f.get("gelu_y"), 1e-6, 1e-5, "gelu(x)");
  kernels::gelu_backward(x, f.get("dy"), dx);
  check_close(dx, f.get("gelu_dx"), 1e-6, 1e-5, "gelu'(x) dy");
}

TEST_CASE("activations work in place: y may be x, dx may be dy") {
  SafetensorsFile f = kernel_fixture("activations");
  Tensor t = f.get("x").clone();
  kernels::gelu_forward(t, t);
  check_close(t, f.get("gelu_y"), 1e-6, 1e-5, "gelu in place");
  Tensor g = f.get("dy").clone();
  kernels::relu_backward(f.get("x"), g, g);
  check_close(g, f.get("relu_dx"), 0, 0, "relu backward in place");
}

TEST_CASE("activations refuse an output of another shape or dtype") {
  Tensor x = Tensor::zeros({2, 3});
  Tensor wrong_shape = Tensor::zeros({3, 2}), wrong_dtype = Tensor::zeros({2, 3}, DType::f64);
  CHECK_THROWS_WITH_AS(kernels::relu_forward(x, wrong_shape),
                       doctest::Contains("relu_forward: argument `y` is f32[3, 2] on cpu but `x` is f32[2, 3]"), Error);
  CHECK_THROWS_WITH_AS(kernels::gelu_backward(x, wrong_dtype, x), doctest::Contains("argument `dy` is f64[2, 3]"),
                       Error);
  Tensor undefined;
  CHECK_THROWS_WITH_AS(kernels::gelu_forward(undefined, x), doctest::Contains("argument `x` is an undefined tensor"),
                       Error);
}
