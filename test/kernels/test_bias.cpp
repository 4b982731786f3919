// bias_add and bias_grad against PyTorch's broadcasting add and its autograd.
#include <doctest/doctest.h>

#include <limits>

#include "tinyddp/kernels/ops.h"
#include "kernel_fixtures.h"

using namespace tinyddp;
using namespace tinyddp::testing;

TEST_CASE("bias_add adds the bias to every row") {
  SafetensorsFile f = kernel_fixture("bias");
  Tensor y = f.get("y").clone();
  kernels::bias_add(y, f.get("bias"));
  check_close(y, f.get("y_plus_bias"), 0, 0, "y + bias");  // one float addition: exact
}

TEST_CASE("bias_grad overwrites with beta 0 and accumulates with beta 1, as .grad does") {
  SafetensorsFile f = kernel_fixture("bias");
  Tensor dbias = Tensor::empty({7});
  kernels::fill(dbias, std::numeric_limits<float>::quiet_NaN());  // beta = 0 must not read it
  kernels::bias_grad(f.get("dy"), dbias, 0.f);
  check_close(dbias, f.get("dbias_beta0"), 1e-6, 1e-5, "dbias, beta = 0");

  Tensor accumulated = f.get("dbias_old").clone();
  kernels::bias_grad(f.get("dy"), accumulated, 1.f);
  check_close(accumulated, f.get("dbias_beta1"), 1e-6, 1e-5, "dbias, beta = 1");
}

TEST_CASE("bias_grad sums columns wider than its stack block") {
  // 1000 columns cross the 512-column blocks of the CPU loop; column j of every row holds j, so the
  // sum over 3 rows is 3j exactly.
  const int64_t rows = 3, cols = 1000;
  std::vector<float> values(static_cast<size_t>(rows * cols)), expected(static_cast<size_t>(cols));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) values[size_t(i * cols + j)] = float(j);
  for (int64_t j = 0; j < cols; ++j) expected[size_t(j)] = 3.f * float(j) + 0.5f * 2.f;
  Tensor dbias = Tensor::empty({cols});
  kernels::fill(dbias, 2.f);
  kernels::bias_grad(Tensor::from_vector(values, {rows, cols}), dbias, 0.5f);
  check_close(dbias.to_vector<float>(), expected, 0, 0, "column sums + 0.5 * old");
}

TEST_CASE("bias kernels check the bias length") {
  Tensor y = Tensor::zeros({4, 3}), bias = Tensor::zeros({4});
  CHECK_THROWS_WITH_AS(kernels::bias_add(y, bias), doctest::Contains("one entry per column (3)"), Error);
  CHECK_THROWS_WITH_AS(kernels::bias_grad(y, bias), doctest::Contains("`dbias` is f32[4]"), Error);
}
