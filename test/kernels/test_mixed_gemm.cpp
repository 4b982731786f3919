// The mixed-precision GEMM (kernels/mixed_gemm.h): operands rounded to bf16 or f16, products summed in
// f32, checked against an independent reference -- the operands rounded by core/half_precision.h's
// functions, the product taken in double -- within the bound of an f32 sum of exact products. And
// the choice of units, from the facts a CPU and oneDNN report, for every host class.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "tinyddp/core/random.h"
#include "tinyddp/kernels/cpu_gemm_libraries.h"
#include "tinyddp/kernels/mixed_gemm.h"
#include "tinyddp/kernels/ops.h"
#include "test/half_precision_reference.h"
#include "test/mixed_gemm_reference.h"
#include "test/support/fake_cuda.h"
#include "test/test_support.h"

using namespace tinyddp;
using namespace tinyddp::testing;

namespace {

Tensor random_matrix(int64_t rows, int64_t cols, uint64_t seed, float scale = 1.f) {
  Generator gen(seed);
  Tensor t = Tensor::empty({rows, cols});
  fill_uniform(t, -scale, scale, gen);
  return t;
}

// Runs kernels::gemm as Linear does -- each operand rounded by round_to into the dtype the device
// wants -- and checks it against the reference: the exact product of the reference-rounded operands,
// within gamma(k + 2) of the products' magnitudes (an f32 sum of exact products, any order).
void check_mixed_gemm(DType narrow, bool ta, bool tb, float beta, Device device = Device::cpu()) {
  const int64_t m = 37, n = 29, k = 300;
  const Tensor a = random_matrix(ta ? k : m, ta ? m : k, 1), b = random_matrix(tb ? n : k, tb ? k : n, 2, 3.f);
  const Tensor c0 = random_matrix(m, n, 3);
  const DType stored = kernels::mixed_operand_dtype(narrow, device);
  Tensor a_op = Tensor::empty(a.shape(), stored, device), b_op = Tensor::empty(b.shape(), stored, device);
  kernels::round_to(a.to(device), narrow, a_op);
  kernels::round_to(b.to(device), narrow, b_op);
  Tensor c = c0.to(device).clone();
  kernels::gemm(a_op, ta, b_op, tb, c, 1.f, beta);

  const Tensor a_ref = reference_rounding(a, narrow), b_ref = reference_rounding(b, narrow);
  const std::vector<float> c0v = c0.to_vector<float>(), got = c.to(Device::cpu()).to_vector<float>();
  const std::vector<double> exact = exact_product(a_ref, ta, b_ref, tb, beta, c0v);
  const std::vector<double> bound = gemm_rounding_bound(a_ref, ta, b_ref, tb, 1.0, beta,
                                                        beta != 0 ? c0v : std::vector<float>{});
  size_t outside = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (!(std::fabs(double(got[i]) - exact[i]) <= bound[i]) && outside++ == 0)
      FAIL_CHECK("c[" << i << "] = " << got[i] << ", exact " << exact[i] << " (bound " << bound[i] << ")");
  CHECK(outside == 0);
  // And the rounding matters: for bf16 (8-bit significands) the unrounded operands' product lies
  // outside that bound for most elements, so the check above could not pass without the rounding.
  if (narrow != DType::bf16) return;
  const std::vector<double> unrounded = exact_product(a, ta, b, tb, beta, c0v);
  size_t differ = 0;
  for (size_t i = 0; i < got.size(); ++i) differ += std::fabs(unrounded[i] - exact[i]) > bound[i];
  CHECK(differ > got.size() / 2);
}

}  // namespace

TEST_CASE("round_to: bf16 and f16 rounding kept in f32 equals the reference rounding, NaN and infinities included") {
  std::vector<float> values = {0.f,
                               -0.f,
                               1.f,
                               1.00390625f,
                               1.005859375f,
                               -3.1415926f,
                               65504.f,
                               65520.f,
                               1e-8f,
                               3e38f,
                               std::numeric_limits<float>::infinity(),
                               -std::numeric_limits<float>::infinity(),
                               std::numeric_limits<float>::quiet_NaN(),
                               std::numeric_limits<float>::denorm_min()};
  const std::vector<float> random = random_matrix(1, 4099, 7, 1e3f).to_vector<float>();
  values.insert(values.end(), random.begin(), random.end());
  const Tensor src = Tensor::from_vector(values);
  for (DType narrow : {DType::bf16, DType::f16}) {
    CAPTURE(dtype_name(narrow));
    Tensor as_f32 = Tensor::empty(src.shape()), as_narrow = Tensor::empty(src.shape(), narrow);
    kernels::round_to(src, narrow, as_f32);
    kernels::round_to(src, narrow, as_narrow);
    Tensor widened = Tensor::empty(src.shape());
    kernels::convert(as_narrow, widened);
    const std::vector<float> got = as_f32.to_vector<float>(), via_narrow = widened.to_vector<float>();
    for (size_t i = 0; i < values.size(); ++i) {
      const float want = rounded_to(values[i], narrow);
      CAPTURE(values[i]);
      if (std::isnan(want)) {
        CHECK(std::isnan(got[i]));
      } else {
        // and core's rounding agrees with the tests' own definition of it (double arithmetic, nearbyint)
        CHECK(double(want) == round_to_format(double(values[i]), narrow == DType::bf16 ? kBf16 : kF16));
        CHECK(std::memcmp(&got[i], &want, sizeof want) == 0);
        CHECK(std::memcmp(&via_narrow[i], &want, sizeof want) == 0);
      }
    }
  }
}

TEST_CASE(
    "gemm with bf16 and f16 operands equals the exact product of the rounded operands within an f32 sum's bound") {
  for (DType narrow : {DType::bf16, DType::f16})
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (float beta : {0.f, 1.f}) {
          CAPTURE(dtype_name(narrow));
          CAPTURE(ta);
          CAPTURE(tb);
          CAPTURE(beta);
          check_mixed_gemm(narrow, ta, tb, beta);
        }
}

TEST_CASE("gemm with operands stored narrow (bf16/f16 tensors) computes the same products as the rounded f32 ones") {
  const Tensor a = random_matrix(64, 96, 11), b = random_matrix(80, 96, 12);
  for (DType narrow : {DType::bf16, DType::f16}) {
    CAPTURE(dtype_name(narrow));
    Tensor a_narrow = Tensor::empty(a.shape(), narrow), b_narrow = Tensor::empty(b.shape(), narrow);
    kernels::round_to(a, narrow, a_narrow);
    kernels::round_to(b, narrow, b_narrow);
    Tensor got = Tensor::zeros({64, 80}), want = Tensor::zeros({64, 80});
    kernels::gemm(a_narrow, false, b_narrow, true, got);
    kernels::gemm(reference_rounding(a, narrow), false, reference_rounding(b, narrow), true, want);
    check_within(
        got.to_vector<float>(), want.to_vector<float>(),
        [&] {  // two f32 sums of the same exact products: each within gamma(k + 2) of the exact sum
          std::vector<double> bound = gemm_rounding_bound(reference_rounding(a, narrow), false,
                                                          reference_rounding(b, narrow), true);
          for (double& x : bound) x *= 2;
          return bound;
        }(),
        "narrow-stored vs rounded f32");
  }
}

TEST_CASE("gemm and round_to refuse mixed-up operands with errors that say what to do") {
  const Tensor f32 = Tensor::zeros({4, 4});
  Tensor bf16 = Tensor::zeros({4, 4}, DType::bf16), f16 = Tensor::zeros({4, 4}, DType::f16), c = Tensor::zeros({4, 4});
  CHECK_THROWS_WITH_AS(kernels::gemm(bf16, false, f32, false, c),
                       doctest::Contains("both operands f32, or both rounded to one narrow type"), Error);
  CHECK_THROWS_WITH_AS(kernels::gemm(bf16, false, f16, false, c), doctest::Contains("but `b` is"), Error);
  Tensor narrow_c = Tensor::zeros({4, 4}, DType::bf16);
  CHECK_THROWS_WITH_AS(kernels::gemm(bf16, false, bf16, false, narrow_c), doctest::Contains("argument `c`"), Error);
  Tensor out = Tensor::zeros({4, 4});
  CHECK_THROWS_WITH_AS(kernels::round_to(f32, DType::f64, out), doctest::Contains("is not a narrow type"), Error);
  CHECK_THROWS_WITH_AS(kernels::round_to(f32, DType::bf16, f16), doctest::Contains("must be bf16 or f32"), Error);
  CHECK_THROWS_WITH_AS(kernels::mixed_operand_dtype(DType::f32, Device::cpu()),
                       doctest::Contains("f32 is not a narrow operand type"), Error);
}

TEST_CASE("the units of the mixed GEMM: oneDNN's bf16 matmul only where bf16 units run it, rounded f32 elsewhere") {
  using kernels::MixedGemmPath;
  kernels::MixedGemmFacts avx2{.cpu_has_avx512_core = false, .f32_gemm = "OpenBLAS (Haswell)"};
  kernels::MixedGemmFacts avx512{.cpu_has_avx512_core = true,
                                 .onednn_isa = "avx512_core_vnni",
                                 .onednn_bf16_matmul = true,
                                 .f32_gemm = "oneDNN (avx512_core_vnni)"};
  kernels::MixedGemmFacts bf16_units = avx512, amx = avx512, amx_without_matmul = avx512, absent = avx512;
  bf16_units.onednn_isa = "avx512_core_bf16";
  amx.onednn_isa = "avx512_core_amx";
  amx_without_matmul.onednn_isa = "avx512_core_amx";
  amx_without_matmul.onednn_bf16_matmul = false;
  amx_without_matmul.why_no_matmul = "oneDNN has no bf16 matmul for this CPU (status 3)";
  absent.onednn_isa = "";

  auto bf16 = [](const kernels::MixedGemmFacts& f) { return kernels::choose_cpu_mixed_gemm(DType::bf16, f); };
  CHECK(bf16(avx2).path == MixedGemmPath::rounded_f32);
  CHECK(bf16(avx2).units.find("no bf16 units on this CPU") != std::string::npos);
  CHECK(bf16(avx2).units.find("OpenBLAS (Haswell)") != std::string::npos);          // and which f32 GEMM does the work
  CHECK(bf16(avx2).units.find("On this CPU fp32 is faster") != std::string::npos);  // and that it is no faster
  CHECK(bf16(bf16_units).units.find("fp32 is faster") == std::string::npos);
  CHECK(bf16(avx512).path == MixedGemmPath::rounded_f32);  // AVX-512 without BF16: emulation loses to f32
  CHECK(bf16(avx512).units.find("avx512_core_vnni") != std::string::npos);
  CHECK(bf16(absent).path == MixedGemmPath::rounded_f32);
  CHECK(bf16(bf16_units).path == MixedGemmPath::onednn_bf16);
  CHECK(bf16(bf16_units).units.find("AVX512-BF16") != std::string::npos);
  CHECK(bf16(amx).path == MixedGemmPath::onednn_bf16);
  CHECK(bf16(amx).units.find("AMX tiles") != std::string::npos);
  CHECK(bf16(amx_without_matmul).path == MixedGemmPath::rounded_f32);
  CHECK(bf16(amx_without_matmul).units.find("status 3") != std::string::npos);
  // f16: no CPU units oneDNN 2.6 runs, on any host.
  for (const auto& facts : {avx2, avx512, bf16_units, amx})
    CHECK(kernels::choose_cpu_mixed_gemm(DType::f16, facts).path == MixedGemmPath::rounded_f32);
  CHECK_THROWS_WITH_AS(kernels::choose_cpu_mixed_gemm(DType::f32, avx2), doctest::Contains("not a narrow operand"),
                       Error);
}

TEST_CASE("this host's mixed GEMM: the operands' dtype follows the units chosen, and the choice is said in words") {
  // Under test/cpu_gemm_cap.sh this runs with oneDNN held to each ISA this CPU has.
  const kernels::MixedGemmChoice& choice = kernels::cpu_mixed_gemm(DType::bf16);
  MESSAGE("bf16 GEMM here: " << choice.units);
  CHECK(!choice.units.empty());
  CHECK(kernels::mixed_operand_dtype(DType::bf16, Device::cpu()) ==
        (choice.path == kernels::MixedGemmPath::onednn_bf16 ? DType::bf16 : DType::f32));
  CHECK(kernels::mixed_operand_dtype(DType::f16, Device::cpu()) == DType::f32);
  if (!kernels::detail::cpu_has_avx512_core()) CHECK(choice.path == kernels::MixedGemmPath::rounded_f32);
  CHECK(kernels::mixed_gemm_units(DType::bf16, Device::cpu()) == choice.units);
}

TEST_CASE(
    "on (fake) CUDA devices the operands are stored narrow, as cuBLAS takes them, and compute the same products") {
  FakeCudaDevices devices({.devices = 1});
  const Device gpu = Device::cuda(0);
  CHECK(kernels::mixed_operand_dtype(DType::bf16, gpu) == DType::bf16);
  CHECK(kernels::mixed_operand_dtype(DType::f16, gpu) == DType::f16);
  CHECK(kernels::mixed_gemm_units(DType::bf16, gpu).find("CUDA_R_16BF") != std::string::npos);
  CHECK(kernels::mixed_gemm_units(DType::f16, gpu).find("CUBLAS_COMPUTE_32F") != std::string::npos);
  for (DType narrow : {DType::bf16, DType::f16}) {
    CAPTURE(dtype_name(narrow));
    check_mixed_gemm(narrow, false, true, 0.f, gpu);
    check_mixed_gemm(narrow, true, false, 1.f, gpu);
  }
}
