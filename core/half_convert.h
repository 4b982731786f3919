// Converting arrays of CPU memory between f32 and the 16-bit floats (bf16, f16).
//
// The element arithmetic is core/half_precision.h's. These loops run it over arrays, through the
// fastest instructions this CPU has, chosen once when the library loads:
//   f32 -> bf16   AVX-512-BF16 (vcvtne2ps2bf16, 32 values per instruction) where the CPU has it,
//                 else the portable loop (which the compiler vectorises, with an AVX2 clone);
//   f16 <-> f32   F16C (vcvtps2ph / vcvtph2ps, 8 values per instruction) where the CPU has it,
//                 else the portable loop;
//   bf16 -> f32   the portable loop: a 16-bit shift, which the compiler vectorises by itself.
// Every path gives the same bits as the portable loop for every input (the tests compare them), so
// ranks on different CPUs round identically.
#pragma once

#include <cstddef>

#include "tinyddp/core/half_precision.h"

namespace tinyddp {

void convert_f32_to_bf16(const float* in, bfloat16* out, size_t n);
void convert_bf16_to_f32(const bfloat16* in, float* out, size_t n);
void convert_f32_to_f16(const float* in, float16* out, size_t n);
void convert_f16_to_f32(const float16* in, float* out, size_t n);

// The same, overloaded on the 16-bit type, for code written once for both (a template over Half).
inline void widen_to_f32(const bfloat16* in, float* out, size_t n) { convert_bf16_to_f32(in, out, n); }
inline void widen_to_f32(const float16* in, float* out, size_t n) { convert_f16_to_f32(in, out, n); }
inline void round_from_f32(const float* in, bfloat16* out, size_t n) { convert_f32_to_bf16(in, out, n); }
inline void round_from_f32(const float* in, float16* out, size_t n) { convert_f32_to_f16(in, out, n); }

// The instructions the conversions above use on this CPU: "avx512_bf16" or "portable", and
// "f16c" or "portable".
const char* bf16_conversion_path();
const char* f16_conversion_path();

// The portable loops alone: the definition every faster path must agree with, bit for bit.
namespace portable {
void convert_f32_to_bf16(const float* in, bfloat16* out, size_t n);
void convert_bf16_to_f32(const bfloat16* in, float* out, size_t n);
void convert_f32_to_f16(const float* in, float16* out, size_t n);
void convert_f16_to_f32(const float16* in, float* out, size_t n);
}  // namespace portable

}  // namespace tinyddp
