// kernels::convert: the same bits as Tensor::to on the CPU, and the argument checks (the GPU kernel:
// test/gpu/test_gpu_kernels.cpp).
#include <doctest/doctest.h>

#include <random>
#include <vector>

#include "tinyddp/kernels/ops.h"

using namespace tinyddp;

namespace {
Tensor random_f32(int64_t n) {
  std::mt19937 rng(16);
  std::normal_distribution<float> normal(0.f, 100.f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = normal(rng);
  v[0] = 1e30f;  // past f16's range: infinity
  return Tensor::from_vector(v);
}
}  // namespace

TEST_CASE("convert writes f32 <-> bf16 and f32 <-> f16 into existing tensors, as Tensor::to rounds") {
  const Tensor f = random_f32(10'007);
  for (DType half : {DType::bf16, DType::f16}) {
    CAPTURE(dtype_name(half));
    Tensor narrow = Tensor::empty({10'007}, half), wide = Tensor::empty({10'007});
    kernels::convert(f, narrow);
    CHECK(bitwise_equal(narrow, f.to(half)));
    kernels::convert(narrow, wide);
    CHECK(bitwise_equal(wide, f.to(half).to(DType::f32)));
  }
  Tensor short_one = Tensor::empty({3}, DType::bf16), two = Tensor::empty({2}, DType::bf16);
  CHECK_THROWS_WITH_AS(kernels::convert(f, short_one), doctest::Contains("same number of elements"), Error);
  CHECK_THROWS_WITH_AS(kernels::convert(Tensor::zeros({2}, DType::f64), two),
                       doctest::Contains("f64 -> bf16 is not supported"), Error);
}
