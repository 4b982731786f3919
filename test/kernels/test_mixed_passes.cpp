// The mixed-precision passes with the rounding fused in (kernels/mixed_passes.cpp): each against the
// tests' own rounding (test/half_precision_reference.h: double arithmetic and nearbyint) and, bit for
// bit, against the unfused calls it replaces.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "tinyddp/core/random.h"
#include "tinyddp/kernels/ops.h"
#include "test/half_precision_reference.h"
#include "test/test_support.h"

using namespace tinyddp;
using namespace tinyddp::testing;

namespace {

// Bit patterns that test the rounding's corners, then random patterns over the whole range.
std::vector<float> corner_and_random_values() {
  std::vector<uint32_t> bits = {
      0x00000000u, 0x80000000u,               // zeros
      0x3f808000u, 0x3f818000u,               // ties: to the even 0x3f80, and up to 0x3f82
      0x3f807fffu, 0x3f808001u,               // just below and above a tie
      0x00008000u, 0x00018000u, 0x00000001u,  // subnormals: ties and the smallest
      0x7f7fffffu, 0xff7f8000u,               // the largest finite: rounds to infinity
      0x7f800000u, 0xff800000u,               // infinities
      0x7f800001u, 0xffc12345u, 0x7fffffffu   // NaNs: signalling, negative with a payload, all ones
  };
  Generator gen(11);
  Tensor halves = Tensor::empty({2, 4096});  // the top and the bottom 16 bits of each pattern
  fill_uniform(halves, 0.f, 1.f, gen);
  const float* h = halves.data<float>();
  for (int i = 0; i < 4096; ++i) bits.push_back(uint32_t(h[i] * 65536.f) << 16 | uint32_t(h[4096 + i] * 65536.f));
  std::vector<float> values;
  for (uint32_t b : bits) values.push_back(float_of(b));
  return values;
}

}  // namespace

TEST_CASE("round_to_both writes the bf16 rounding twice -- its bits and its f32 value -- as the reference rounds") {
  const std::vector<float> values = corner_and_random_values();
  const Tensor src = Tensor::from_vector(values);
  Tensor narrow = Tensor::empty(src.shape(), DType::bf16), wide = Tensor::empty(src.shape());
  kernels::round_to_both(src, DType::bf16, narrow, wide);
  Tensor rounded_alone = Tensor::empty(src.shape());
  kernels::round_to(src, DType::bf16, rounded_alone);
  for (size_t i = 0; i < values.size(); ++i) {
    const uint32_t u = bits_of(values[i]);
    CAPTURE(u);
    const uint16_t got = narrow.data<bfloat16>()[i].bits;
    const float got_wide = wide.data<float>()[i];
    CHECK(bits_of(got_wide) == uint32_t(got) << 16);                      // the two forms agree
    CHECK(bits_of(rounded_alone.data<float>()[i]) == bits_of(got_wide));  // and round_to's
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      CHECK(got == uint16_t((u >> 16) | 0x0040u));  // NaN: its top bits kept, made quiet
    } else {
      const double want = round_to_format(double(values[i]), kBf16);
      CHECK(double(got_wide) == want);
      CHECK(std::signbit(got_wide) == std::signbit(values[i]));
    }
  }
  // f16 goes through the 16-bit type (F16C where there is one): the same agreement.
  Tensor narrow16 = Tensor::empty(src.shape(), DType::f16), wide16 = Tensor::empty(src.shape());
  kernels::round_to_both(src, DType::f16, narrow16, wide16);
  for (size_t i = 0; i < values.size(); ++i) {
    if (std::isnan(values[i])) continue;
    CAPTURE(values[i]);
    CHECK(double(wide16.data<float>()[i]) == round_to_format(double(values[i]), kF16));
    CHECK(float(narrow16.data<float16>()[i]) == wide16.data<float>()[i]);
  }
}

TEST_CASE("bias_grad_and_round writes, bit for bit, what bias_grad then round_to write") {
  // 1100 columns: more than one of bias_grad's 512-column blocks, and a ragged last one.
  const int64_t rows = 9, cols = 1100;
  Generator gen(3);
  Tensor dy = Tensor::empty({rows, cols}), old = Tensor::empty({cols});
  fill_uniform(dy, -1e-2f, 1e-2f, gen);
  fill_uniform(old, -1.f, 1.f, gen);
  dy.data<float>()[5] = float_of(0x3f808000u);  // a tie, and a NaN, among them
  dy.data<float>()[cols + 7] = float_of(0xffc12345u);
  for (DType narrow : {DType::bf16, DType::f16})
    for (DType stored : {DType::f32, narrow})
      for (float beta : {0.f, 1.f}) {
        const std::string narrow_name = dtype_name(narrow), stored_name = dtype_name(stored);
        CAPTURE(narrow_name);
        CAPTURE(stored_name);
        CAPTURE(beta);
        Tensor db_fused = old.clone(), db_apart = old.clone();
        Tensor fused = Tensor::empty(dy.shape(), stored), apart = Tensor::empty(dy.shape(), stored);
        kernels::bias_grad_and_round(dy, db_fused, beta, narrow, fused);
        kernels::bias_grad(dy, db_apart, beta);
        kernels::round_to(dy, narrow, apart);
        CHECK(bitwise_equal(db_fused, db_apart));
        CHECK(bitwise_equal(fused, apart));
        // and the sums are the columns' sums (one holds the NaN)
        const std::vector<float> dyv = dy.to_vector<float>(), oldv = old.to_vector<float>();
        for (int64_t j : {int64_t(0), int64_t(511), int64_t(512), cols - 1}) {
          double sum = 0, magnitude = 0;
          for (int64_t i = 0; i < rows; ++i) {
            sum += dyv[size_t(i * cols + j)];
            magnitude += std::fabs(dyv[size_t(i * cols + j)]);
          }
          if (beta != 0) sum += oldv[size_t(j)], magnitude += std::fabs(oldv[size_t(j)]);
          CHECK(std::fabs(double(db_fused.data<float>()[j]) - sum) <= gamma_n(rows + 1) * magnitude);
        }
        CHECK(std::isnan(db_fused.data<float>()[7]));
      }
}

TEST_CASE("round_to_both and bias_grad_and_round refuse mixed-up arguments, saying which and what to do") {
  Tensor x = Tensor::zeros({4, 3}), wide = Tensor::empty({4, 3}), narrow = Tensor::empty({4, 3}, DType::bf16);
  Tensor f16 = Tensor::empty({4, 3}, DType::f16), short_wide = Tensor::empty({5});
  CHECK_THROWS_WITH_AS(kernels::round_to_both(x, DType::f64, narrow, wide), doctest::Contains("is not a narrow type"),
                       Error);
  CHECK_THROWS_WITH_AS(kernels::round_to_both(x, DType::bf16, f16, wide),
                       doctest::Contains("`narrow_dst` is f16[4, 3] on cpu but must be bf16"), Error);
  CHECK_THROWS_WITH_AS(kernels::round_to_both(x, DType::bf16, narrow, short_wide),
                       doctest::Contains("the same number of elements"), Error);
  Tensor db = Tensor::zeros({2});
  CHECK_THROWS_WITH_AS(kernels::bias_grad_and_round(x, db, 0.f, DType::bf16, wide),
                       doctest::Contains("one entry per column (3)"), Error);
  Tensor db3 = Tensor::zeros({3});
  CHECK_THROWS_WITH_AS(kernels::bias_grad_and_round(x, db3, 0.f, DType::bf16, f16),
                       doctest::Contains("must be bf16 or f32"), Error);
}
