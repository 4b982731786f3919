// The two 16-bit floating-point formats, and the conversions to and from f32, written once.
//
//   bf16 (bfloat16):  1 sign bit, 8 exponent bits, 7 mantissa bits. The top half of an f32: the
//                     same range (up to ~3.4e38), about 3 significant decimal digits.
//   f16 (IEEE half):  1 sign bit, 5 exponent bits, 10 mantissa bits: more precision (~3.3 digits),
//                     much less range (largest finite 65504, smallest normal 2^-14, subnormals to 2^-24).
//
// Widening (16 -> 32 bits) is exact: every bf16 and every f16 is an f32. Narrowing rounds to
// nearest, ties to even (IEEE's default, and what PyTorch's .to(torch.bfloat16) / .half() do):
// a value halfway between two neighbours goes to the one whose last mantissa bit is 0, so ties
// round up and down equally often and a long sum does not drift one way.
//
// NaN stays NaN, and quiet: its sign and top payload bits are kept and the quiet bit is set (what
// the x86 conversion instructions do). Rounding the bits of a NaN blindly could carry into the
// exponent and turn it into an infinity, which is why NaN is tested first.
//
// Each function is TINYDDP_HD: the CPU loops (core/half_convert.h), the collectives' reduction
// (comm/reduce_op.h) and the CUDA kernel (kernels/cuda/convert.cu) all run this arithmetic.
#pragma once

#include <stdint.h>
#include <string.h>

#include "tinyddp/core/hd.h"

namespace tinyddp {

TINYDDP_HD uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
#endif
}

TINYDDP_HD float f32_from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// ---- bf16 ----------------------------------------------------------------------------------------

// f32 -> bf16 bits, round to nearest even. Adding 0x7fff (just under half of the dropped 16 bits)
// plus the kept half's lowest bit, then truncating, rounds up exactly when the dropped part is above
// half, or exactly half with an odd kept part. A carry out of the mantissa lands in the exponent,
// which is the right next value (and the largest finite f32s round up to infinity, as IEEE says).
TINYDDP_HD uint16_t bf16_bits_from_f32(float f) {
  const uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x0040u);  // NaN: quiet, never rounded
  const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return uint16_t((u + rounding) >> 16);
}

// bf16 bits -> f32: the bits are the top half of the f32, exactly.
TINYDDP_HD float f32_from_bf16_bits(uint16_t h) { return f32_from_bits(uint32_t(h) << 16); }

// ---- f16 -----------------------------------------------------------------------------------------

// f16 subnormals are multiples of 2^-24; f16 normals start at 2^-14 (f32 bits 0x38800000).
constexpr uint32_t kF32BitsOfF16MinNormal = 0x38800000u;
// 65520 = 65504 + half an ulp: from here on (and ties included, 65504's mantissa being odd) the
// value rounds to infinity.
constexpr uint32_t kF32BitsOfF16Overflow = 0x477ff000u;
// 2^-25, half the smallest f16 subnormal: below it every value rounds to zero (and at it too: a tie
// with an even zero).
constexpr uint32_t kF32BitsOfF16HalfMinSubnormal = 0x33000000u;

// Rounds `m` >> `shift` to nearest even (0 < shift < 32).
TINYDDP_HD uint32_t shift_right_to_nearest_even(uint32_t m, uint32_t shift) {
  const uint32_t kept = m >> shift, dropped = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  return kept + ((dropped > half || (dropped == half && (kept & 1u))) ? 1u : 0u);
}

// f32 -> f16 bits, round to nearest even, subnormals kept, overflow to infinity, NaN kept quiet.
TINYDDP_HD uint16_t f16_bits_from_f32(float f) {
  const uint32_t u = f32_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint16_t(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // NaN
  if (a >= kF32BitsOfF16Overflow) return uint16_t(sign | 0x7c00u);              // infinity, or rounds to it
  if (a >= kF32BitsOfF16MinNormal) {
    // Re-bias the exponent (127 -> 15: subtract 112 << 23), then drop 13 mantissa bits as bf16 drops 16.
    const uint32_t r = a - 0x38000000u;
    return uint16_t(sign | ((r + 0x0fffu + ((r >> 13) & 1u)) >> 13));
  }
  if (a <= kF32BitsOfF16HalfMinSubnormal) return uint16_t(sign);
  // A subnormal result: the value is (1.m) * 2^(e - 127) = m24 * 2^(e - 150), in units of 2^-24 that
  // is m24 >> (126 - e). Rounding up from the largest subnormal gives 0x400, the smallest normal.
  const uint32_t exponent = a >> 23, mantissa = (a & 0x7fffffu) | 0x800000u;
  return uint16_t(sign | shift_right_to_nearest_even(mantissa, 126u - exponent));
}

// f16 bits -> f32, exactly.
TINYDDP_HD float f32_from_f16_bits(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  if (exponent == 0x1fu) {  // infinity, or NaN (made quiet)
    return f32_from_bits(sign | 0x7f800000u | (mantissa << 13) | (mantissa != 0 ? 0x400000u : 0u));
  }
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in f32 (at most 10 significant bits)
    const float magnitude = float(mantissa) * 5.9604644775390625e-8f;  // 2^-24
    return sign ? -magnitude : magnitude;
  }
  return f32_from_bits(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

// ---- the C++ types of DType::bf16 and DType::f16 ---------------------------------------------------
// Storage types: 2 bytes holding the bit pattern. They read as float (implicitly, exactly) and are
// made from a float (explicitly: that rounds), so arithmetic on them happens in f32, as it does in
// PyTorch's CPU kernels.
struct bfloat16 {
  uint16_t bits = 0;
  bfloat16() = default;
  TINYDDP_HD explicit bfloat16(float f) : bits(bf16_bits_from_f32(f)) {}
  TINYDDP_HD operator float() const { return f32_from_bf16_bits(bits); }
  TINYDDP_HD static bfloat16 from_bits(uint16_t b) {
    bfloat16 h;
    h.bits = b;
    return h;
  }
};

struct float16 {
  uint16_t bits = 0;
  float16() = default;
  TINYDDP_HD explicit float16(float f) : bits(f16_bits_from_f32(f)) {}
  TINYDDP_HD operator float() const { return f32_from_f16_bits(bits); }
  TINYDDP_HD static float16 from_bits(uint16_t b) {
    float16 h;
    h.bits = b;
    return h;
  }
};

static_assert(sizeof(bfloat16) == 2 && sizeof(float16) == 2, "16-bit types must be 2 bytes");

}  // namespace tinyddp
