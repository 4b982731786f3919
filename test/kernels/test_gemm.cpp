// gemm against PyTorch (a float64 product rounded once), in all four transpose layouts, with every
// CPU GEMM library this build has (kernels/cpu_gemm.h), whichever one this machine would choose.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "tinyddp/core/random.h"
#include "tinyddp/kernels/cpu_gemm.h"
#include "tinyddp/kernels/ops.h"
#include "kernel_fixtures.h"

using namespace tinyddp;
using namespace tinyddp::testing;

namespace {

// Runs `check` once with each CPU GEMM library of this build, then restores the machine's choice.
template <typename Check>
void with_each_cpu_gemm(Check check) {
  const kernels::CpuGemm chosen = kernels::cpu_gemm();
  for (kernels::CpuGemm gemm : kernels::available_cpu_gemms()) {
    CAPTURE(kernels::cpu_gemm_name(gemm));
    kernels::set_cpu_gemm(gemm);
    check();
  }
  kernels::set_cpu_gemm(chosen);
}

// The fixtures hold the exact product rounded once to float (computed in float64: within u |out| of
// exact), and any float32 GEMM lies within gemm_rounding_bound of the exact product: the two together
// bound how far a correct GEMM can be from the fixture, on every library, ISA and thread count.
std::vector<double> fixture_bound(std::vector<double> gemm_bound, const Tensor& out) {
  const std::vector<float> ref = out.to_vector<float>();
  for (size_t i = 0; i < ref.size(); ++i) gemm_bound[i] += kFloatRoundoff * std::fabs(double(ref[i]));
  return gemm_bound;
}

}  // namespace

TEST_CASE("gemm: all four transpose combinations, with alpha and beta, match PyTorch") {
  with_each_cpu_gemm([] {
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
        check_within(c.to_vector<float>(), f.get("out").to_vector<float>(),
                     fixture_bound(gemm_rounding_bound(a, false, b, false, alpha, beta, f.get("c").to_vector<float>()),
                                   f.get("out")),
                     "alpha*op(a)@op(b) + beta*c");

        // beta = 0 overwrites: c's old contents are never read, even when they are NaN.
        Tensor nan_c = Tensor::empty({37, 19});
        kernels::fill(nan_c, std::numeric_limits<float>::quiet_NaN());
        kernels::gemm(lhs, ta, rhs, tb, nan_c, alpha0);
        check_within(nan_c.to_vector<float>(), f.get("out_beta0").to_vector<float>(),
                     fixture_bound(gemm_rounding_bound(a, false, b, false, alpha0), f.get("out_beta0")),
                     "alpha*op(a)@op(b), beta = 0");
      }
    }
  });
}

TEST_CASE("gemm writes into a view without touching the memory around it") {
  with_each_cpu_gemm([] {
    SafetensorsFile f = kernel_fixture("gemm");
    // c as rows [2, 39) of a larger buffer: as a gradient that is a view into a DDP bucket.
    Tensor buffer = Tensor::empty({41, 19});
    kernels::fill(buffer, 7.f);
    Tensor c = buffer.slice_rows(2, 39);
    c.copy_from(f.get("c"));
    const float alpha = f.get("alpha_beta").item<float>(0), beta = f.get("alpha_beta").item<float>(1);
    kernels::gemm(f.get("a"), false, f.get("b"), false, c, alpha, beta);
    check_within(c.to_vector<float>(), f.get("out").to_vector<float>(),
                 fixture_bound(gemm_rounding_bound(f.get("a"), false, f.get("b"), false, alpha, beta,
                                                   f.get("c").to_vector<float>()),
                               f.get("out")),
                 "gemm into a view");
    // Every value outside rows [2, 39): the two rows before the view and the two after it, 76 in all.
    const std::vector<float> all = buffer.to_vector<float>();
    int64_t guards = 0, touched = 0;
    for (int64_t i = 0; i < 41 * 19; ++i) {
      if (i >= 2 * 19 && i < 39 * 19) continue;
      ++guards;
      if (all[size_t(i)] != 7.f && touched++ == 0) FAIL_CHECK("buffer[" << i << "] = " << all[size_t(i)] << ", was 7");
    }
    CHECK(guards == 76);
    CHECK(touched == 0);
  });
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
  CHECK_THROWS_WITH_AS(kernels::gemm(v, false, b, false, c), doctest::Contains("argument `a` must have 2 dimension"),
                       Error);
  Tensor square = Tensor::zeros({3, 3});
  CHECK_THROWS_WITH_AS(kernels::gemm(square, false, square, false, square),
                       doctest::Contains("`c` overlaps the memory of `a`"), Error);
  Tensor d = Tensor::zeros({3, 2}, DType::f64);
  CHECK_THROWS_WITH_AS(kernels::gemm(a, true, b, false, d), doctest::Contains("argument `c` is f64[3, 2]"), Error);
}

TEST_CASE("set_cpu_threads accepts a thread count and refuses zero") {
  with_each_cpu_gemm([] {
    for (int threads : {2, 1}) {
      CAPTURE(threads);
      kernels::set_cpu_threads(threads);
      SafetensorsFile f = kernel_fixture("gemm");
      Tensor c = Tensor::empty({37, 19});
      kernels::gemm(f.get("a"), false, f.get("b"), false, c, f.get("alpha0").item<float>(0));
      check_within(c.to_vector<float>(), f.get("out_beta0").to_vector<float>(),
                   fixture_bound(gemm_rounding_bound(f.get("a"), false, f.get("b"), false,
                                                     f.get("alpha0").item<float>(0)),
                                 f.get("out_beta0")),
                   "gemm on the set number of threads");
    }
  });
  CHECK_THROWS_WITH_AS(kernels::set_cpu_threads(0), doctest::Contains("at least one thread"), Error);
}

TEST_CASE("a larger product agrees across the CPU GEMM libraries, and the choice names itself") {
  // [256, 784] x [784, 1024]^T, the first layer of the benchmark MLP: the libraries block these sums
  // differently, so they agree to rounding, not bit for bit. The reference is a double-precision sum.
  Generator gen(5);
  Tensor a = Tensor::empty({256, 784}), w = Tensor::empty({1024, 784});
  fill_uniform(a, 0.f, 1.f, gen);
  fill_uniform(w, -0.04f, 0.04f, gen);
  // Each element of the product is within gamma(784) sum_l |a_il| |w_jl| of exact, whatever the
  // library's blocking (test_support.h); the reference sums in double, 2^29 times closer.
  std::vector<double> reference(256 * 1024), bound(256 * 1024);
  const float* pa = a.data<float>();
  const float* pw = w.data<float>();
  for (int64_t i = 0; i < 256; i += 51)  // every 51st row: enough to see a wrong layout, quick
    for (int64_t j = 0; j < 1024; ++j) {
      double sum = 0, magnitude = 0;
      for (int64_t l = 0; l < 784; ++l) {
        sum += double(pa[i * 784 + l]) * double(pw[j * 784 + l]);
        magnitude += std::fabs(double(pa[i * 784 + l]) * double(pw[j * 784 + l]));
      }
      reference[size_t(i * 1024 + j)] = sum;
      bound[size_t(i * 1024 + j)] = gamma_n(784) * magnitude;
    }
  with_each_cpu_gemm([&] {
    Tensor y = Tensor::empty({256, 1024});
    kernels::gemm(a, false, w, true, y);
    const float* py = y.data<float>();
    int64_t outside = 0;
    for (int64_t i = 0; i < 256; i += 51)
      for (int64_t j = 0; j < 1024; ++j) {
        const size_t at = size_t(i * 1024 + j);
        if (!(std::fabs(double(py[at]) - reference[at]) <= bound[at]) && outside++ == 0)
          FAIL_CHECK("y[" << i << ", " << j << "] = " << py[at] << ", exactly " << reference[at] << " (bound "
                          << bound[at] << ")");
      }
    CHECK(outside == 0);
  });
  const std::string description = kernels::cpu_gemm_description();
  CHECK(description.find(kernels::cpu_gemm_name(kernels::cpu_gemm())) != std::string::npos);
  MESSAGE("CPU GEMM on this machine: ", description);
}
