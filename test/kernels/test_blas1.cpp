// fill, scale, axpy and sum_of_squares: PyTorch references and closed forms.
#include <doctest/doctest.h>

#include <cmath>

#include "tinyddp/kernels/ops.h"
#include "kernel_fixtures.h"

using namespace tinyddp;
using namespace tinyddp::testing;

TEST_CASE("scale and axpy match PyTorch") {
  SafetensorsFile f = kernel_fixture("blas1");
  const float alpha = f.get("alpha").item<float>();
  Tensor x = f.get("x").clone();
  kernels::scale(x, alpha);
  check_close(x, f.get("scaled"), 0, 0, "alpha * x");
  Tensor y = f.get("y").clone();
  kernels::axpy(alpha, f.get("x"), y);
  check_close(y, f.get("axpy"), 1e-6, 1e-6, "y + alpha * x");  // fused or not, within one rounding
}

TEST_CASE("axpy with x and y the same tensor doubles it") {
  Tensor t = Tensor::from_vector<float>({1.f, -2.f, 3.5f});
  kernels::axpy(1.f, t, t);
  check_close(t.to_vector<float>(), {2.f, -4.f, 7.f}, 0, 0, "t += t");
}

TEST_CASE("sum_of_squares matches PyTorch in double precision") {
  SafetensorsFile f = kernel_fixture("blas1");
  const double got = kernels::sum_of_squares(f.get("x"));
  const double ref = f.get("sum_of_squares").item<double>();
  CHECK(std::fabs(got - ref) <= 1e-12 * ref);
}

TEST_CASE("sum_of_squares: closed forms, exact in double") {
  // sum_{i=1}^{n} i^2 = n (n + 1) (2n + 1) / 6; every term and partial sum is an exact double here.
  for (int64_t n : {int64_t(1), int64_t(7), int64_t(8), int64_t(9), int64_t(1001)}) {
    CAPTURE(n);
    std::vector<float> values(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) values[size_t(i)] = float(i + 1);
    CHECK(kernels::sum_of_squares(Tensor::from_vector(values)) == double(n * (n + 1) * (2 * n + 1) / 6));
  }
  CHECK(kernels::sum_of_squares(Tensor::zeros({0})) == 0.0);
  // 3e20^2 overflows float but not double.
  CHECK(kernels::sum_of_squares(Tensor::from_vector<float>({3e20f, 4e20f})) == doctest::Approx(25e40));
}

TEST_CASE("fill writes every element, and only the view's elements") {
  Tensor base = Tensor::zeros({10});
  Tensor middle = base.view(3, {5});
  kernels::fill(middle, -1.25f);
  check_close(base.to_vector<float>(), {0, 0, 0, -1.25f, -1.25f, -1.25f, -1.25f, -1.25f, 0, 0}, 0, 0, "fill of a view");
}

TEST_CASE("BLAS-1 kernels refuse other dtypes and mismatched shapes") {
  Tensor i = Tensor::zeros({3}, DType::i32), x = Tensor::zeros({3}), y = Tensor::zeros({4});
  CHECK_THROWS_WITH_AS(kernels::fill(i, 1.f), doctest::Contains("fill: argument `x` is i32[3] on cpu but must be f32"),
                       Error);
  CHECK_THROWS_WITH_AS(kernels::scale(i, 1.f), doctest::Contains("scale: argument `x`"), Error);
  CHECK_THROWS_WITH_AS(kernels::sum_of_squares(i), doctest::Contains("sum_of_squares: argument `x`"), Error);
  CHECK_THROWS_WITH_AS(kernels::axpy(1.f, x, y), doctest::Contains("axpy: argument `y` is f32[4]"), Error);
}
