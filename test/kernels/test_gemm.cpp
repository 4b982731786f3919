// gemm against PyTorch (a float64 product rounded once), in all four transpose layouts.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "kernel_fixtures.h"
#include "kernels/ops.h"

using namespace tinyddp;
using namespace tinyddp::testing;

TEST_CASE("gemm: all four transpose combinations, with alpha and beta, match PyTorch") {
  SafetensorsFile f = kernel_fixture("gemm");
  const Tensor& a = f.get("a");  // [37, 23]
  const Tensor& b = f.get("b");  // [23, 19]
  const float alpha = f.get("alpha_beta").item<float>(0), beta = f.get("alpha_beta").item<float>(1);
  const float alpha0 = f.get("alpha0").item<float>(0);
  const Tensor at = transposed(a), bt = transposed(b);

  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      CAPTURE(ta);
      CAPTURE(tb);
      // op(ta ? at : a) is always a, op(tb ? bt : b) is always b: every layout computes the same product.
      const Tensor& lhs = ta ? at : a;
      const Tensor& rhs = tb ? bt : b;
      Tensor c = f.get("c").clone();
      kernels::gemm(lhs, ta, rhs, tb, c, alpha, beta);
      check_close(c, f.get("out"), 1e-5, 1e-5, "alpha*op(a)@op(b) + beta*c");

      // beta = 0 overwrites: c's old contents are never read, even when they are NaN.
      Tensor nan_c = Tensor::empty({37, 19});
      kernels::fill(nan_c, std::numeric_limits<float>::quiet_NaN());
      kernels::gemm(lhs, ta, rhs, tb, nan_c, alpha0);
      check_close(nan_c, f.get("out_beta0"), 1e-5, 1e-5, "alpha*op(a)@op(b), beta = 0");
    }
  }
}

TEST_CASE("gemm writes into a view without touching the memory around it") {
  SafetensorsFile f = kernel_fixture("gemm");
  // c as rows [2, 39) of a larger buffer: as a gradient that is a view into a DDP bucket.
  Tensor buffer = Tensor::empty({41, 19});
  kernels::fill(buffer, 7.f);
  Tensor c = buffer.slice_rows(2, 39);
  c.copy_from(f.get("c"));
  const float alpha = f.get("alpha_beta").item<float>(0), beta = f.get("alpha_beta").item<float>(1);
  kernels::gemm(f.get("a"), false, f.get("b"), false, c, alpha, beta);
  check_close(c, f.get("out"), 1e-5, 1e-5, "gemm into a view");
  for (int64_t i : {int64_t(0), int64_t(2 * 19 - 1), int64_t(39 * 19), int64_t(41 * 19 - 1)})
    CHECK(buffer.item<float>(i) == 7.f);
}

TEST_CASE("gemm with an empty inner dimension scales c by beta") {
  Tensor a = Tensor::empty({3, 0}), b = Tensor::empty({0, 2});
  Tensor c = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {3, 2});
  kernels::gemm(a, false, b, false, c, 1.f, 0.5f);
  check_close(c.to_vector<float>(), {0.5f, 1.f, 1.5f, 2.f, 2.5f, 3.f}, 0, 0, "beta*c with k = 0");
  kernels::gemm(a, false, b, false, c, 1.f, 0.f);
  check_close(c.to_vector<float>(), std::vector<float>(6, 0.f), 0, 0, "k = 0, beta = 0");
}

TEST_CASE("gemm rejects operands whose shapes do not chain") {
  Tensor a = Tensor::zeros({4, 3}), b = Tensor::zeros({4, 2}), c = Tensor::zeros({4, 2});
  CHECK_THROWS_WITH_AS(kernels::gemm(a, false, b, false, c), doctest::Contains("inner dimensions differ"), Error);
  // a^T @ b is [3, 2]: the inner dimensions now agree but c has the wrong shape.
  CHECK_THROWS_WITH_AS(kernels::gemm(a, true, b, false, c), doctest::Contains("allocate c as [3, 2]"), Error);
  Tensor v = Tensor::zeros({4});
  CHECK_THROWS_WITH_AS(kernels::gemm(v, false, b, false, c), doctest::Contains("argument `a` must have 2 dimension"), Error);
  Tensor square = Tensor::zeros({3, 3});
  CHECK_THROWS_WITH_AS(kernels::gemm(square, false, square, false, square), doctest::Contains("`c` overlaps the memory of `a`"), Error);
  Tensor d = Tensor::zeros({3, 2}, DType::f64);
  CHECK_THROWS_WITH_AS(kernels::gemm(a, true, b, false, d), doctest::Contains("argument `c` is f64[3, 2]"), Error);
}

TEST_CASE("set_cpu_threads accepts a thread count and refuses zero") {
  kernels::set_cpu_threads(1);
  SafetensorsFile f = kernel_fixture("gemm");
  Tensor c = Tensor::empty({37, 19});
  kernels::gemm(f.get("a"), false, f.get("b"), false, c, f.get("alpha0").item<float>(0));
  check_close(c, f.get("out_beta0"), 1e-5, 1e-5, "single-threaded gemm");
  CHECK_THROWS_WITH_AS(kernels::set_cpu_threads(0), doctest::Contains("at least one thread"), Error);
}
