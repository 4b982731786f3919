// The precision policy (nn/precision/precision.h): its words, its scope, and what it does to Linear --
// forward and backward against the exact product of the rounded operands -- and the loss scaler's
// state machine (nn/precision/loss_scaler.h).
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <thread>
#include <vector>

#include "tinyddp/core/random.h"
#include "tinyddp/kernels/ops.h"
#include "tinyddp/nn/activations.h"
#include "tinyddp/nn/linear.h"
#include "tinyddp/nn/precision/loss_scaler.h"
#include "tinyddp/nn/precision/precision.h"
#include "tinyddp/nn/sequential.h"
#include "test/mixed_gemm_reference.h"
#include "test/test_support.h"

using namespace tinyddp;
using namespace tinyddp::testing;

TEST_CASE("parse_precision reads fp32, bf16 and fp16 (and PyTorch's spellings) and refuses anything else by name") {
  CHECK(nn::parse_precision("fp32") == nn::Precision::fp32);
  CHECK(nn::parse_precision("BF16") == nn::Precision::bf16);
  CHECK(nn::parse_precision("bfloat16") == nn::Precision::bf16);
  CHECK(nn::parse_precision("bf16-mixed") == nn::Precision::bf16);
  CHECK(nn::parse_precision("fp16") == nn::Precision::fp16);
  CHECK(nn::parse_precision("half") == nn::Precision::fp16);
  for (nn::Precision p : {nn::Precision::fp32, nn::Precision::bf16, nn::Precision::fp16})
    CHECK(nn::parse_precision(nn::precision_name(p)) == p);
  CHECK_THROWS_WITH_AS(nn::parse_precision("bf17", "--precision"),
                       doctest::Contains("--precision 'bf17' is not a precision; hint: use fp32"), Error);
  CHECK_THROWS_WITH_AS(nn::parse_precision(""), doctest::Contains("precision '' is not a precision"), Error);
  CHECK(nn::operand_dtype(nn::Precision::bf16) == DType::bf16);
  CHECK(nn::operand_dtype(nn::Precision::fp16) == DType::f16);
  CHECK(nn::needs_loss_scaling(nn::Precision::fp16));
  CHECK(!nn::needs_loss_scaling(nn::Precision::bf16));
}

TEST_CASE("PrecisionScope sets the thread's policy, nests, and restores the one before it") {
  CHECK(nn::current_precision() == nn::Precision::fp32);
  {
    nn::PrecisionScope outer(nn::Precision::bf16);
    CHECK(nn::current_precision() == nn::Precision::bf16);
    {
      nn::PrecisionScope inner(nn::Precision::fp16);
      CHECK(nn::current_precision() == nn::Precision::fp16);
      nn::Precision elsewhere = nn::Precision::bf16;
      std::thread([&] { elsewhere = nn::current_precision(); }).join();
      CHECK(elsewhere == nn::Precision::fp32);  // per thread, as autocast's state is
    }
    CHECK(nn::current_precision() == nn::Precision::bf16);
  }
  CHECK(nn::current_precision() == nn::Precision::fp32);
  try {
    nn::PrecisionScope scope(nn::Precision::fp16);
    throw std::runtime_error("leaving by an exception");
  } catch (const std::runtime_error&) {}
  CHECK(nn::current_precision() == nn::Precision::fp32);
}

namespace {

// |got - exact| <= bound, element by element.
void check_against_exact(const std::vector<float>& got, const std::vector<double>& exact,
                         const std::vector<double>& bound, const char* what) {
  REQUIRE(got.size() == exact.size());
  size_t outside = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (!(std::fabs(double(got[i]) - exact[i]) <= bound[i]) && outside++ == 0)
      FAIL_CHECK(what << "[" << i << "] = " << got[i] << ", exact " << exact[i] << " (bound " << bound[i] << ")");
  CHECK_MESSAGE(outside == 0, what << ": " << outside << " values outside their bound");
}

}  // namespace

TEST_CASE("Linear under bf16 and fp16: forward and backward are the exact products of the rounded operands, in f32") {
  const int64_t batch = 24, in = 70, out = 33;
  for (nn::Precision precision : {nn::Precision::bf16, nn::Precision::fp16}) {
    CAPTURE(nn::precision_name(precision));
    const DType narrow = nn::operand_dtype(precision);
    Generator gen(5);
    nn::Linear layer(in, out, gen);
    Tensor x = Tensor::empty({batch, in}), dy = Tensor::empty({batch, out});
    fill_uniform(x, -2.f, 2.f, gen);
    fill_uniform(dy, -0.1f, 0.1f, gen);
    const std::vector<float> master = layer.weight().value.to_vector<float>();

    Tensor y;
    {
      nn::PrecisionScope scope(precision);
      y = layer.forward(x);
    }
    Tensor dx = layer.backward(dy);  // outside the scope: backward follows its forward's precision
    CHECK(y.dtype() == DType::f32);
    CHECK(dx.dtype() == DType::f32);
    CHECK(layer.weight().value.dtype() == DType::f32);
    CHECK(layer.weight().value.to_vector<float>() == master);  // the master weight is untouched

    const Tensor xr = reference_rounding(x, narrow), wr = reference_rounding(layer.weight().value, narrow);
    const Tensor dyr = reference_rounding(dy, narrow);
    const std::vector<float> bias = layer.bias().value.to_vector<float>();
    // y = x W^T + b: an f32 sum of exact products, then the bias added (gemm_rounding_bound's c0 per column).
    check_against_exact(y.to_vector<float>(), exact_product(xr, false, wr, true, 1.0, bias),
                        gemm_rounding_bound(xr, false, wr, true, 1.0, 1.0, bias), "y");
    check_against_exact(layer.weight().grad.to_vector<float>(), exact_product(dyr, true, xr, false),
                        gemm_rounding_bound(dyr, true, xr, false), "dW");
    check_against_exact(dx.to_vector<float>(), exact_product(dyr, false, wr, false),
                        gemm_rounding_bound(dyr, false, wr, false), "dx");
    // db sums the unrounded f32 dy: the reductions stay f32.
    const std::vector<float> dyv = dy.to_vector<float>();
    std::vector<double> db(size_t(out), 0.0), db_bound(size_t(out), 0.0);
    for (int64_t i = 0; i < batch; ++i)
      for (int64_t j = 0; j < out; ++j) {
        db[size_t(j)] += dyv[size_t(i * out + j)];
        db_bound[size_t(j)] += gamma_n(batch) * std::fabs(dyv[size_t(i * out + j)]);
      }
    check_against_exact(layer.bias().grad.to_vector<float>(), db, db_bound, "db");
  }
}

TEST_CASE("Linear under fp32 is unchanged by the policy, and a forward in fp32 after a mixed one computes in fp32") {
  Generator gen(9);
  nn::Linear layer(16, 8, gen);
  Tensor x = Tensor::empty({4, 16});
  fill_uniform(x, -1.f, 1.f, gen);
  const Tensor plain = layer.forward(x);
  {
    nn::PrecisionScope scope(nn::Precision::bf16);
    CHECK(layer.forward(x).to_vector<float>() != plain.to_vector<float>());
  }
  CHECK(layer.forward(x).to_vector<float>() == plain.to_vector<float>());
}

TEST_CASE("Linear under bf16 and fp16 keeps its input for backward in the narrow type: half the bytes of fp32") {
  const int64_t batch = 12, in = 40, out = 9;
  Generator gen(21);
  nn::Linear layer(in, out, gen);
  Tensor x = Tensor::empty({batch, in});
  fill_uniform(x, -1.f, 1.f, gen);
  CHECK(layer.saved_activation_bytes() == 0);  // nothing before a forward
  layer.forward(x);
  CHECK(layer.saved_activation_bytes() == size_t(batch * in * 4));
  for (nn::Precision precision : {nn::Precision::bf16, nn::Precision::fp16}) {
    nn::PrecisionScope scope(precision);
    layer.forward(x);
    CHECK(layer.saved_activation_bytes() == size_t(batch * in * 2));
  }
  // A model's: the sum over its layers. Linear(40, 30), ReLU (its f32 input; under bf16 on the CPU one
  // byte per element, whether x > 0), Linear(30, 9).
  nn::Sequential model;
  model.emplace<nn::Linear>(in, 30, gen);
  model.emplace<nn::ReLU>();
  model.emplace<nn::Linear>(30, out, gen);
  model.forward(x);
  CHECK(model.saved_activation_bytes() == size_t(batch * (in + 30 + 30) * 4));
  nn::PrecisionScope scope(nn::Precision::bf16);
  model.forward(x);
  CHECK(model.saved_activation_bytes() == size_t(batch * (in * 2 + 30 * 1 + 30 * 2)));
}

TEST_CASE("ReLU under bf16 keeps a byte per element and gives fp32's gradient bit for bit") {
  Generator gen(8);
  Tensor x = Tensor::empty({6, 50}), dy = Tensor::empty({6, 50});
  fill_uniform(x, -1.f, 1.f, gen);
  fill_uniform(dy, -1.f, 1.f, gen);
  x.data<float>()[0] = std::numeric_limits<float>::denorm_min();  // > 0, though bf16 would round it to 0
  x.data<float>()[1] = -0.f;
  nn::ReLU plain, mixed;
  const Tensor y_plain = plain.forward(x);
  Tensor y_mixed;
  {
    nn::PrecisionScope scope(nn::Precision::bf16);
    y_mixed = mixed.forward(x);
  }
  CHECK(plain.saved_activation_bytes() == 6 * 50 * 4);
  CHECK(mixed.saved_activation_bytes() == 6 * 50);
  CHECK(bitwise_equal(y_plain, y_mixed));
  const Tensor dx = mixed.backward(dy);
  CHECK(bitwise_equal(plain.backward(dy), dx));
  CHECK(dx.data<float>()[0] == dy.data<float>()[0]);
  CHECK(dx.data<float>()[1] == 0.f);
}

TEST_CASE("Linear under bf16 takes an input already in bf16 as its f32 values rounded, bit for bit; fp32 refuses it") {
  const int64_t batch = 8, in = 50, out = 6;
  Generator gen(4);
  nn::Linear a(in, out, gen);
  Generator same(4);
  nn::Linear b(in, out, same);
  Tensor x = Tensor::empty({batch, in}), dy = Tensor::empty({batch, out});
  fill_uniform(x, -3.f, 3.f, gen);
  fill_uniform(dy, -1.f, 1.f, gen);
  Tensor x_bf16 = Tensor::empty(x.shape(), DType::bf16);
  kernels::convert(x, x_bf16);
  Tensor ya, yb;
  {
    nn::PrecisionScope scope(nn::Precision::bf16);
    ya = a.forward(x);
    yb = b.forward(x_bf16);
  }
  CHECK(ya.to_vector<float>() == yb.to_vector<float>());
  CHECK(a.backward(dy).to_vector<float>() == b.backward(dy).to_vector<float>());
  CHECK(a.weight().grad.to_vector<float>() == b.weight().grad.to_vector<float>());
  CHECK(a.bias().grad.to_vector<float>() == b.bias().grad.to_vector<float>());
  CHECK(b.saved_activation_bytes() == size_t(batch * in * 2));
  CHECK_THROWS_WITH_AS(b.forward(x_bf16), doctest::Contains("the input is bf16[8, 50] on cpu but must be f32"), Error);
  nn::PrecisionScope scope(nn::Precision::fp16);
  CHECK_THROWS_WITH_AS(b.forward(x_bf16), doctest::Contains("but must be f32 or f16"), Error);
}

// ---- the loss scaler ----------------------------------------------------------------------------------

TEST_CASE("LossScaler: an overflow skips the step and halves the scale; growth_interval finite steps double it") {
  nn::LossScaler scaler({.init_scale = 1024, .growth_interval = 3});
  CHECK(scaler.scale() == 1024);
  scaler.update(false);  // overflow: back off, count from zero
  CHECK(scaler.scale() == 512);
  CHECK(scaler.skipped_steps() == 1);
  CHECK(scaler.growth_tracker() == 0);
  scaler.update(true);
  scaler.update(true);
  CHECK(scaler.scale() == 512);
  CHECK(scaler.growth_tracker() == 2);
  scaler.update(false);  // an overflow also resets the run of finite steps
  CHECK(scaler.scale() == 256);
  CHECK(scaler.growth_tracker() == 0);
  for (int i = 0; i < 3; ++i) scaler.update(true);
  CHECK(scaler.scale() == 512);  // grown after 3 in a row
  CHECK(scaler.growth_tracker() == 0);
  CHECK(scaler.skipped_steps() == 2);
  // Never grown past a finite f32: an infinite scale would make every step overflow.
  nn::LossScaler huge({.init_scale = 0x1p127, .growth_interval = 1});
  huge.update(true);
  CHECK(huge.scale() == 0x1p127);
}

TEST_CASE("LossScaler scales the loss gradient, and unscales only finite gradients, exactly") {
  nn::LossScaler scaler({.init_scale = 256});
  Tensor g = Tensor::from_vector(std::vector<float>{0.5f, -3e-6f, 1.f});
  scaler.scale_loss_gradient(g);
  CHECK(g.to_vector<float>() == std::vector<float>{128.f, -3e-6f * 256.f, 256.f});
  nn::Parameter p;
  p.value = Tensor::zeros({3});
  p.grad = g.clone();
  p.has_grad = true;
  CHECK(nn::gradients_finite({&p}));
  CHECK(scaler.unscale({&p}, true));
  CHECK(p.grad.to_vector<float>() == std::vector<float>{0.5f, -3e-6f, 1.f});  // powers of two: exact
  p.grad.data<float>()[1] = std::numeric_limits<float>::infinity();
  CHECK(!nn::gradients_finite({&p}));
  CHECK(!scaler.unscale({&p}, false));
  CHECK(std::isinf(p.grad.data<float>()[1]));  // left as it was: the step throws it away
  p.has_grad = false;
  CHECK(nn::gradients_finite({&p}));  // a gradient that does not exist is not read
}

TEST_CASE("LossScaler: its state round-trips through metadata; bad options and damaged state are refused by name") {
  nn::LossScaler scaler({.init_scale = 65536, .growth_interval = 2});
  scaler.update(false);
  scaler.update(true);
  nn::LossScaler restored;
  restored.load_state(scaler.state());
  CHECK(restored.scale() == 32768);
  CHECK(restored.growth_tracker() == 1);
  CHECK(restored.skipped_steps() == 1);
  nn::LossScaler untouched;
  untouched.load_state({});  // from a run without a scaler: the defaults stay
  CHECK(untouched.scale() == 65536);
  CHECK_THROWS_WITH_AS(restored.load_state({{"loss_scaler.scale", "big"}}),
                       doctest::Contains("the saved loss_scaler.scale is 'big', not a finite number"), Error);
  CHECK_THROWS_WITH_AS(restored.load_state({{"loss_scaler.growth_tracker", "1.5"}}),
                       doctest::Contains("must be whole numbers"), Error);
  CHECK_THROWS_WITH_AS(nn::LossScaler({.init_scale = 0}), doctest::Contains("init_scale is 0"), Error);
  CHECK_THROWS_WITH_AS(nn::LossScaler({.growth_factor = 1}), doctest::Contains("growth_factor is 1"), Error);
  CHECK_THROWS_WITH_AS(nn::LossScaler({.backoff_factor = 1.5}), doctest::Contains("backoff_factor is 1.5"), Error);
  CHECK_THROWS_WITH_AS(nn::LossScaler({.growth_interval = 0}), doctest::Contains("growth_interval is 0"), Error);
}
