#include "tinyddp/core/half_convert.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define TINYDDP_X86_CONVERSIONS 1
#endif

namespace tinyddp {

// ---- the portable loops ----------------------------------------------------------------------------
// Plain loops over the element functions. The library is compiled for baseline x86-64, so they also
// get an AVX2 clone, picked at load time (as kernels/cpu_vector_clones.h does for the kernels; not
// under ThreadSanitizer, whose runtime is not up when the loader picks a clone).
#if defined(TINYDDP_X86_CONVERSIONS) && !defined(__SANITIZE_THREAD__)
#define TINYDDP_CONVERSION_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define TINYDDP_CONVERSION_CLONES
#endif

namespace portable {

TINYDDP_CONVERSION_CLONES void convert_f32_to_bf16(const float* in, bfloat16* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i].bits = bf16_bits_from_f32(in[i]);
}
TINYDDP_CONVERSION_CLONES void convert_bf16_to_f32(const bfloat16* in, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = f32_from_bf16_bits(in[i].bits);
}
TINYDDP_CONVERSION_CLONES void convert_f32_to_f16(const float* in, float16* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i].bits = f16_bits_from_f32(in[i]);
}
TINYDDP_CONVERSION_CLONES void convert_f16_to_f32(const float16* in, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = f32_from_f16_bits(in[i].bits);
}

}  // namespace portable

#ifdef TINYDDP_X86_CONVERSIONS
namespace {

// ---- AVX-512-BF16 ------------------------------------------------------------------------------------
// vcvtne2ps2bf16 rounds to nearest even and keeps NaN quiet exactly as bf16_bits_from_f32 does, but it
// flushes f32 subnormal inputs to zero (and bf16 keeps them: the formats share their exponent range).
// A block of 32 values with a subnormal among them, rare in practice, takes the portable loop instead.
__attribute__((target("avx512f,avx512bf16"))) void f32_to_bf16_avx512(const float* in, bfloat16* out, size_t n) {
  const __m512i exponent_bits = _mm512_set1_epi32(0x7f800000), mantissa_bits = _mm512_set1_epi32(0x007fffff);
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512i lo = _mm512_loadu_si512(in + i), hi = _mm512_loadu_si512(in + i + 16);
    const __mmask16 subnormal_lo = _mm512_mask_test_epi32_mask(_mm512_testn_epi32_mask(lo, exponent_bits), lo,
                                                               mantissa_bits);
    const __mmask16 subnormal_hi = _mm512_mask_test_epi32_mask(_mm512_testn_epi32_mask(hi, exponent_bits), hi,
                                                               mantissa_bits);
    if ((subnormal_lo | subnormal_hi) != 0) {
      portable::convert_f32_to_bf16(in + i, out + i, 32);
      continue;
    }
    const __m512bh packed = _mm512_cvtne2ps_pbh(_mm512_castsi512_ps(hi), _mm512_castsi512_ps(lo));
    _mm512_storeu_si512(out + i, reinterpret_cast<const __m512i&>(packed));
  }
  portable::convert_f32_to_bf16(in + i, out + i, n - i);
}

// ---- F16C --------------------------------------------------------------------------------------------
// vcvtps2ph with round-to-nearest-even and vcvtph2ps are IEEE conversions: subnormals, overflow to
// infinity and quiet NaNs as f16_bits_from_f32 / f32_from_f16_bits compute them.
__attribute__((target("avx,f16c"))) void f32_to_f16_f16c(const float* in, float16* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i packed = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), packed);
  }
  portable::convert_f32_to_f16(in + i, out + i, n - i);
}

__attribute__((target("avx,f16c"))) void f16_to_f32_f16c(const float16* in, float* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  portable::convert_f16_to_f32(in + i, out + i, n - i);
}

bool has_avx512_bf16() { return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16"); }
bool has_f16c() { return __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c"); }

}  // namespace
#endif

namespace {

// The loops this CPU runs, chosen once, when the library loads.
struct ConversionPaths {
  void (*f32_to_bf16)(const float*, bfloat16*, size_t) = portable::convert_f32_to_bf16;
  void (*f32_to_f16)(const float*, float16*, size_t) = portable::convert_f32_to_f16;
  void (*f16_to_f32)(const float16*, float*, size_t) = portable::convert_f16_to_f32;
  const char* bf16_name = "portable";
  const char* f16_name = "portable";
};

ConversionPaths choose_paths() {
  ConversionPaths p;
#ifdef TINYDDP_X86_CONVERSIONS
  if (has_avx512_bf16()) {
    p.f32_to_bf16 = f32_to_bf16_avx512;
    p.bf16_name = "avx512_bf16";
  }
  if (has_f16c()) {
    p.f32_to_f16 = f32_to_f16_f16c;
    p.f16_to_f32 = f16_to_f32_f16c;
    p.f16_name = "f16c";
  }
#endif
  return p;
}

const ConversionPaths& paths() {
  static const ConversionPaths chosen = choose_paths();
  return chosen;
}
// Chosen at load time (not on the first conversion, inside a timed collective).
[[maybe_unused]] const ConversionPaths& chosen_at_load = paths();

}  // namespace

void convert_f32_to_bf16(const float* in, bfloat16* out, size_t n) { paths().f32_to_bf16(in, out, n); }
void convert_bf16_to_f32(const bfloat16* in, float* out, size_t n) { portable::convert_bf16_to_f32(in, out, n); }
void convert_f32_to_f16(const float* in, float16* out, size_t n) { paths().f32_to_f16(in, out, n); }
void convert_f16_to_f32(const float16* in, float* out, size_t n) { paths().f16_to_f32(in, out, n); }

const char* bf16_conversion_path() { return paths().bf16_name; }
const char* f16_conversion_path() { return paths().f16_name; }

}  // namespace tinyddp
