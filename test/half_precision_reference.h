// An independent definition of rounding to bf16 and f16, for the tests: double arithmetic and
// nearbyint (ties to even), none of the bit tricks of core/half_precision.h.
#pragma once

#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace tinyddp::testing {

// A binary floating-point format: `precision` significant bits, `min_exponent` the exponent of the
// smallest subnormal's one bit, `max_finite` the largest finite value.
struct Format {
  int precision;
  int min_exponent;
  double max_finite;
};
constexpr Format kBf16{8, -133, 0x1.fep127};  // 1.1111111b x 2^127
constexpr Format kF16{11, -24, 65504.0};

// x rounded to `format`, to nearest with ties to even; a value beyond max_finite after rounding
// (with an unbounded exponent) is an infinity, NaN stays NaN. x is an f32 or an exact f32 sum, so
// scaling by a power of two is exact and nearbyint does the one rounding.
inline double round_to_format(double x, Format format) {
  if (std::isnan(x) || std::isinf(x) || x == 0) return x;
  int e = 0;
  std::frexp(x, &e);  // |x| = m * 2^e, m in [0.5, 1): the top bit has weight 2^(e-1)
  const int lsb = std::max(e - format.precision, format.min_exponent);
  const double rounded = std::ldexp(std::nearbyint(std::ldexp(x, -lsb)), lsb);
  if (std::fabs(rounded) > format.max_finite) return std::copysign(std::numeric_limits<double>::infinity(), x);
  return rounded;
}

inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The value of 16 bits in a format with `mantissa_bits` and `bias` (an independent decoder): NaN for
// an all-ones exponent with a mantissa, infinity without.
inline double decode16(uint16_t h, int mantissa_bits, int exponent_bits) {
  const int bias = (1 << (exponent_bits - 1)) - 1;
  const int exponent = (h >> mantissa_bits) & ((1 << exponent_bits) - 1);
  const int mantissa = h & ((1 << mantissa_bits) - 1);
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (exponent == (1 << exponent_bits) - 1)
    return mantissa ? std::numeric_limits<double>::quiet_NaN() : sign * std::numeric_limits<double>::infinity();
  if (exponent == 0) return sign * std::ldexp(double(mantissa), 1 - bias - mantissa_bits);
  return sign * std::ldexp(double(mantissa + (1 << mantissa_bits)), exponent - bias - mantissa_bits);
}
inline double decode_bf16(uint16_t h) { return decode16(h, 7, 8); }
inline double decode_f16(uint16_t h) { return decode16(h, 10, 5); }

}  // namespace tinyddp::testing
