// bf16 and f16: the element conversions (core/half_precision.h), the bulk loops of this CPU
// (core/half_convert.h), Tensor::to and safetensors, checked against an independent rounding
// (test/half_precision_reference.h: double arithmetic and nearbyint) and against numpy's float16.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "tinyddp/core/half_convert.h"
#include "tinyddp/core/safetensors.h"
#include "tinyddp/core/tensor.h"
#include "test/half_precision_reference.h"
#include "test/test_skip.h"

using namespace tinyddp;
using namespace tinyddp::testing;

namespace {

std::string hex(uint32_t v);

// The f32 inputs worth checking for a 16-bit format whose values `decode` gives: every 16-bit value
// itself, the midpoint to its upper neighbour (a tie), one f32 ulp either side of that midpoint, and
// `random_count` random bit patterns. `shift` is 16 for bf16 (f32 bits = h << 16); for f16 the
// midpoints come from the decoded values.
std::vector<float> interesting_inputs(double (*decode)(uint16_t), size_t random_count) {
  std::vector<float> inputs;
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const double value = decode(uint16_t(h)), next = decode(uint16_t(h + 1));
    if (std::isnan(value)) continue;
    inputs.push_back(float(value));
    if ((h & 0x7fff) == 0x7fff || std::isnan(next) || std::isinf(value)) continue;
    const float mid = float((value + next) / 2);  // exact: both have at most 11 significant bits
    inputs.push_back(mid);
    inputs.push_back(std::nextafter(mid, 0.f));
    inputs.push_back(std::nextafter(mid, mid > 0 ? INFINITY : -INFINITY));
  }
  std::mt19937_64 rng(1606);
  for (size_t i = 0; i < random_count; ++i) inputs.push_back(float_of(uint32_t(rng())));
  return inputs;
}

// Whether 16-bit result `h` (decoded by `decode`) is the correct rounding of `x` in `format`.
bool rounds_correctly(float x, uint16_t h, double (*decode)(uint16_t), Format format, uint16_t quiet_bit) {
  const double got = decode(h);
  if (std::isnan(x)) return std::isnan(got) && (h & quiet_bit) && ((h & 0x8000) != 0) == std::signbit(x);
  const double want = round_to_format(double(x), format);
  return got == want && std::signbit(got) == std::signbit(want);
}

template <typename Convert>
void check_narrowing(const char* what, const std::vector<float>& inputs, Convert convert, double (*decode)(uint16_t),
                     Format format, uint16_t quiet_bit) {
  std::vector<uint16_t> out(inputs.size());
  convert(inputs.data(), out.data(), inputs.size());
  size_t wrong = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (rounds_correctly(inputs[i], out[i], decode, format, quiet_bit)) continue;
    if (++wrong <= 5)
      FAIL_CHECK((std::string(what) + ": f32 bits " + hex(bits_of(inputs[i])) + " gave " + hex(out[i])));
  }
  CHECK_MESSAGE(wrong == 0, (std::string(what) + ": " + std::to_string(wrong) + " of " + std::to_string(inputs.size()) +
                             " inputs rounded wrongly"));
}

std::string hex(uint32_t v) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%x", v);
  return text;
}

auto as_bf16(uint16_t* p) { return reinterpret_cast<bfloat16*>(p); }
auto as_f16(uint16_t* p) { return reinterpret_cast<float16*>(p); }

}  // namespace

TEST_CASE("widening bf16 and f16 to f32 is exact for all 65536 bit patterns of each") {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const double bf = decode_bf16(uint16_t(h)), f = decode_f16(uint16_t(h));
    const float got_bf = f32_from_bf16_bits(uint16_t(h)), got_f = f32_from_f16_bits(uint16_t(h));
    if (std::isnan(bf))
      REQUIRE(std::isnan(got_bf));
    else
      REQUIRE_MESSAGE((double(got_bf) == bf && std::signbit(got_bf) == std::signbit(bf)), ("bf16 " + hex(h)));
    if (std::isnan(f))
      REQUIRE((std::isnan(got_f) && (bits_of(got_f) & 0x400000u)));
    else
      REQUIRE_MESSAGE((double(got_f) == f && std::signbit(got_f) == std::signbit(f)), ("f16 " + hex(h)));
  }
  // The bulk loops, portable and this CPU's, give the same bits as the element functions.
  std::vector<uint16_t> all(0x10000);
  for (uint32_t h = 0; h < 0x10000; ++h) all[h] = uint16_t(h);
  std::vector<float> portable_out(all.size()), chosen_out(all.size());
  portable::convert_f16_to_f32(as_f16(all.data()), portable_out.data(), all.size());
  convert_f16_to_f32(as_f16(all.data()), chosen_out.data(), all.size());
  for (uint32_t h = 0; h < 0x10000; ++h) {
    REQUIRE(bits_of(portable_out[h]) == bits_of(f32_from_f16_bits(uint16_t(h))));
    REQUIRE_MESSAGE(bits_of(chosen_out[h]) == bits_of(portable_out[h]),
                    (std::string(f16_conversion_path()) + " f16 " + hex(h)));
  }
  convert_bf16_to_f32(as_bf16(all.data()), chosen_out.data(), all.size());
  for (uint32_t h = 0; h < 0x10000; ++h) REQUIRE(bits_of(chosen_out[h]) == (h << 16));
}

TEST_CASE("f32 -> bf16 and f32 -> f16 round to nearest even at every value, tie and neighbour of a tie") {
  MESSAGE((std::string("conversion paths on this CPU: bf16 ") + bf16_conversion_path() + ", f16 " +
           f16_conversion_path() + " (an AVX-512-BF16 path is only checked on a CPU that has it)"));
  const std::vector<float> bf_inputs = interesting_inputs(decode_bf16, 1 << 20);
  auto element_bf16 = [](const float* in, uint16_t* out, size_t n) {
    for (size_t i = 0; i < n; ++i) out[i] = bf16_bits_from_f32(in[i]);
  };
  check_narrowing("bf16 element", bf_inputs, element_bf16, decode_bf16, kBf16, 0x40);
  check_narrowing(
      "bf16 portable", bf_inputs,
      [](const float* in, uint16_t* out, size_t n) { portable::convert_f32_to_bf16(in, as_bf16(out), n); }, decode_bf16,
      kBf16, 0x40);
  check_narrowing(
      "bf16 this CPU", bf_inputs,
      [](const float* in, uint16_t* out, size_t n) { convert_f32_to_bf16(in, as_bf16(out), n); }, decode_bf16, kBf16,
      0x40);

  const std::vector<float> f_inputs = interesting_inputs(decode_f16, 1 << 20);
  check_narrowing(
      "f16 portable", f_inputs,
      [](const float* in, uint16_t* out, size_t n) { portable::convert_f32_to_f16(in, as_f16(out), n); }, decode_f16,
      kF16, 0x200);
  check_narrowing(
      "f16 this CPU", f_inputs,
      [](const float* in, uint16_t* out, size_t n) { convert_f32_to_f16(in, as_f16(out), n); }, decode_f16, kF16,
      0x200);
}

TEST_CASE(
    "special values: NaN stays a quiet NaN (never an infinity), infinities, zeros, the largest values, subnormals") {
  // NaNs whose blind rounding would carry into the exponent: all-ones payloads, signalling NaNs.
  for (uint32_t nan : {0x7fffffffu, 0xffffffffu, 0x7f800001u, 0x7fbfffffu, 0xff800001u, 0x7fc00000u, 0x7f80ffffu}) {
    CAPTURE(nan);
    const uint16_t b = bf16_bits_from_f32(float_of(nan)), h = f16_bits_from_f32(float_of(nan));
    CHECK(std::isnan(f32_from_bf16_bits(b)));
    CHECK((b & 0x0040) != 0);
    CHECK((b & 0x8000) == ((nan >> 16) & 0x8000));
    CHECK(std::isnan(f32_from_f16_bits(h)));
    CHECK((h & 0x0200) != 0);
  }
  CHECK(bf16_bits_from_f32(INFINITY) == 0x7f80);
  CHECK(bf16_bits_from_f32(-INFINITY) == 0xff80);
  CHECK(f16_bits_from_f32(INFINITY) == 0x7c00);
  CHECK(f16_bits_from_f32(-0.f) == 0x8000);
  CHECK(bf16_bits_from_f32(-0.f) == 0x8000);
  // The largest finite f32 is past bf16's largest (0x7f7f) by more than half an ulp: infinity.
  CHECK(bf16_bits_from_f32(float_of(0x7f7fffffu)) == 0x7f80);
  CHECK(bf16_bits_from_f32(float_of(0x7f7f7fffu)) == 0x7f7f);  // just below the tie: stays finite
  CHECK(bf16_bits_from_f32(float_of(0x7f7f8000u)) == 0x7f80);  // the tie rounds to even: infinity
  CHECK(f16_bits_from_f32(65504.f) == 0x7bff);
  CHECK(f16_bits_from_f32(65519.996f) == 0x7bff);
  CHECK(f16_bits_from_f32(65520.f) == 0x7c00);
  // f16 subnormals: 2^-24 is the smallest; 2^-25 is a tie with zero (even: zero); just above it, 2^-24.
  CHECK(f16_bits_from_f32(std::ldexp(1.f, -24)) == 0x0001);
  CHECK(f16_bits_from_f32(std::ldexp(1.f, -25)) == 0x0000);
  CHECK(f16_bits_from_f32(std::nextafter(std::ldexp(1.f, -25), 1.f)) == 0x0001);
  CHECK(f16_bits_from_f32(std::ldexp(3.f, -25)) == 0x0002);      // 1.5 units: tie, to even 2
  CHECK(f16_bits_from_f32(std::ldexp(1023.5f, -24)) == 0x0400);  // the largest subnormal rounds up into the normals
  // f32 subnormals become bf16 subnormals (same exponent range), rounded to nearest even.
  CHECK(bf16_bits_from_f32(float_of(0x00010000u)) == 0x0001);
  CHECK(bf16_bits_from_f32(float_of(0x00008000u)) == 0x0000);
  CHECK(bf16_bits_from_f32(float_of(0x00018000u)) == 0x0002);
  // Ties to even in the normal range: 1 + 2^-8 is halfway between 1 and 1 + 2^-7.
  CHECK(bf16_bits_from_f32(1.00390625f) == 0x3f80);
  CHECK(bf16_bits_from_f32(1.01171875f) == 0x3f82);  // 1 + 3*2^-8: halfway between odd 0x3f81 and even 0x3f82
}

TEST_CASE("f32 -> f16 agrees with numpy's float16 on a million random values and the special ones") {
  // The first python3 that has numpy: the one on PATH, or Debian's (python3-numpy) behind a pyenv shim.
  std::string python;
  for (const char* candidate : {"python3", "/usr/bin/python3"})
    if (python.empty() && std::system((std::string(candidate) + " -c 'import numpy' >/dev/null 2>&1").c_str()) == 0)
      python = candidate;
  if (python.empty()) {
    TINYDDP_SKIP("no python3 with numpy (apt-get install python3-numpy)");
  }
  std::vector<float> inputs = interesting_inputs(decode_f16, 1 << 20);
  std::erase_if(inputs, [](float x) { return std::isnan(x); });  // numpy keeps NaN payloads its own way
  const auto dir = std::filesystem::temp_directory_path() / ("tinyddp_f16_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string in_path = (dir / "in.f32").string(), out_path = (dir / "out.f16").string();
  std::ofstream(in_path, std::ios::binary)
      .write(reinterpret_cast<const char*>(inputs.data()), std::streamsize(inputs.size() * 4));
  const std::string command = python +
                              " -c \"import numpy as np, sys; np.fromfile(sys.argv[1], dtype='<f4').astype('<f2')"
                              ".tofile(sys.argv[2])\" " +
                              in_path + " " + out_path + " 2>/dev/null";
  REQUIRE(std::system(command.c_str()) == 0);
  std::vector<uint16_t> numpy_bits(inputs.size());
  std::ifstream(out_path, std::ios::binary)
      .read(reinterpret_cast<char*>(numpy_bits.data()), std::streamsize(numpy_bits.size() * 2));
  std::filesystem::remove_all(dir);
  std::vector<uint16_t> ours(inputs.size());
  convert_f32_to_f16(inputs.data(), as_f16(ours.data()), inputs.size());
  size_t wrong = 0;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (ours[i] != numpy_bits[i] && ++wrong <= 5)
      FAIL_CHECK(("f32 " + hex(bits_of(inputs[i])) + ": ours " + hex(ours[i]) + ", numpy " + hex(numpy_bits[i])));
  CHECK_MESSAGE(wrong == 0, (std::to_string(wrong) + " of " + std::to_string(inputs.size()) + " differ from numpy"));
}

TEST_CASE("Tensor::to converts to and from bf16 and f16 by the same rounding, and refuses NaN into integers") {
  const std::vector<float> values = {1.f, -2.5f, 1.00390625f, 3.14159265f, 1e-8f, 70000.f, -0.f, 1e30f};
  Tensor f = Tensor::from_vector(values);
  Tensor b = f.to(DType::bf16), h = f.to(DType::f16);
  CHECK(b.dtype() == DType::bf16);
  CHECK(b.element_size() == 2);
  for (size_t i = 0; i < values.size(); ++i) {
    CHECK(b.data<bfloat16>()[i].bits == bf16_bits_from_f32(values[i]));
    CHECK(h.data<float16>()[i].bits == f16_bits_from_f32(values[i]));
  }
  CHECK(b.to(DType::f32).to_vector<float>()[3] == 3.140625f);
  CHECK(std::isinf(h.to(DType::f32).to_vector<float>()[5]));
  CHECK(b.to(DType::f64).to_vector<double>()[1] == -2.5);
  CHECK(b.view(0, {4}).to(DType::i64).to_vector<int64_t>() == std::vector<int64_t>{1, -2, 1, 3});
  CHECK(Tensor::from_vector<int64_t>({7, -300}).to(DType::bf16).to(DType::f32).to_vector<float>() ==
        std::vector<float>{7.f, -300.f});
  // bf16 -> f16: widened exactly, rounded once.
  CHECK(b.to(DType::f16).data<float16>()[3].bits == f16_bits_from_f32(3.140625f));
  CHECK_THROWS_WITH_AS(Tensor::from_vector<float>({NAN}).to(DType::bf16).to(DType::i32),
                       doctest::Contains("i32 cannot hold"), Error);
  CHECK(dtype_from_name("bf16") == DType::bf16);
  CHECK(dtype_from_name("f16") == DType::f16);
  CHECK(std::string(dtype_safetensors_name(DType::bf16)) == "BF16");
  CHECK(std::string(dtype_safetensors_name(DType::f16)) == "F16");
}

TEST_CASE("bf16 and f16 tensors round-trip through safetensors under the names BF16 and F16") {
  const auto path = (std::filesystem::temp_directory_path() /
                     ("tinyddp_half_" + std::to_string(::getpid()) + ".safetensors"))
                        .string();
  Tensor b = Tensor::from_vector<float>({1.f, -0.5f, 3.f, 1e-3f, 2e38f}).to(DType::bf16).reshape({5});
  Tensor h = Tensor::from_vector<float>({1.f, -0.5f, 3.f, 1e-6f, 60000.f, -7.f}).to(DType::f16).reshape({2, 3});
  save_safetensors(path, {{"grad.bf16", b}, {"grad.f16", h}});
  // The header names the dtypes as the safetensors format (and PyTorch's torch.bfloat16/float16) do.
  std::ifstream file(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  CHECK(bytes.find("\"dtype\":\"BF16\"") != std::string::npos);
  CHECK(bytes.find("\"dtype\":\"F16\"") != std::string::npos);
  SafetensorsFile loaded = load_safetensors(path);
  std::filesystem::remove(path);
  CHECK(bitwise_equal(loaded.get("grad.bf16"), b));
  CHECK(bitwise_equal(loaded.get("grad.f16"), h));
}
