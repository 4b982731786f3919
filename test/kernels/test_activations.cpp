// ReLU and exact GELU, forward and backward, against torch.relu / F.gelu and autograd, on inputs
// that include +-0, tiny values and large |x| (where erf saturates and exp(-x^2/2) underflows).
#include <doctest/doctest.h>

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
