// Layers and losses against PyTorch autograd (test/fixtures/make_nn.py -> nn_layers.safetensors):
// forward values, input gradients and parameter gradients; plus Linear's initial distribution, the
// hook order DDP relies on, and the errors a user meets first.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "tinyddp/core/cuda_runtime.h"
#include "tinyddp/core/philox.h"
#include "tinyddp/core/random.h"
#include "tinyddp/core/safetensors.h"
#include "tinyddp/kernels/ops.h"
#include "tinyddp/nn/activations.h"
#include "tinyddp/nn/linear.h"
#include "tinyddp/nn/loss.h"
#include "tinyddp/nn/sequential.h"
#include "test/test_skip.h"
#include "test/test_support.h"

using namespace tinyddp;
using tinyddp::testing::check_close;
using tinyddp::testing::check_within;
using tinyddp::testing::fixture;
using tinyddp::testing::gamma_n;
using tinyddp::testing::gemm_rounding_bound;
using tinyddp::testing::kFloatRoundoff;

namespace {

const SafetensorsFile& layers_fixture() {
  static const SafetensorsFile file = load_safetensors(fixture("nn_layers.safetensors"));
  return file;
}

nlohmann::json meta(const std::string& key) { return nlohmann::json::parse(layers_fixture().metadata.at(key)); }

// float32 GEMMs of a few dozen terms, summed in another order than PyTorch's: a few ulps apart. (The
// Linear tests derive their bounds instead; these stay for the elementwise layers and the Sequential.)
constexpr double kAtol = 1e-6, kRtol = 1e-5;

// Linear's products, each computed in float32 by this library's GEMM and by PyTorch's, each within
// gemm_rounding_bound of the exact product: the two within twice that of each other. For x [5, 7],
// W [4, 7], dy [5, 4] of the fixture: y = x W^T + b, dx = dy W, dW = dy^T x, db = dy^T 1 (the bias
// gradient, a sum of 5 rows, bounded as the product with a column of ones).
struct LinearBounds {
  std::vector<double> y, dx, dweight, dbias;
};
LinearBounds linear_bounds(const SafetensorsFile& f) {
  const Tensor& x = f.get("linear.x");
  const Tensor& w = f.get("linear.weight");
  const Tensor& dy = f.get("linear.dy");
  auto twice = [](std::vector<double> b) {
    for (double& v : b) v *= 2;
    return b;
  };
  return {twice(gemm_rounding_bound(x, false, w, true, 1, 1, f.get("linear.bias").to_vector<float>())),
          twice(gemm_rounding_bound(dy, false, w, false)), twice(gemm_rounding_bound(dy, true, x, false)),
          twice(gemm_rounding_bound(dy, true, Tensor::from_vector(std::vector<float>(5, 1.f), {5, 1}), false))};
}

// After a second backward, for a gradient whose products have k = 5 terms (the batch) and whose
// single-pass bound (ours and PyTorch's, each within half of it of exact g) is B: ours is the first
// gradient g1 plus a GEMM with beta = 1, within gamma(k + 2) (M + |g1|) of g1 + the exact sum (M, the
// terms' magnitudes: gamma(k + 2) M = B / 2), so within B + gamma(k + 2) |g1| of 2g; the reference,
// twice PyTorch's, within B of 2g. |g1| is about half |2g|: B + B + gamma(k + 2) |ref| bounds it.
std::vector<double> accumulated_bound(const std::vector<double>& single, const Tensor& doubled_ref) {
  std::vector<double> out = single;
  const std::vector<float> ref = doubled_ref.to_vector<float>();
  for (size_t i = 0; i < out.size(); ++i) out[i] = 2 * single[i] + gamma_n(5 + 2) * std::fabs(double(ref[i]));
  return out;
}

// The Sequential of make_nn.py: Linear(6, 8), ReLU, Linear(8, 8), GELU, Linear(8, 3), with PyTorch's weights.
nn::Sequential make_fixture_sequential() {
  Generator gen(0);
  nn::Sequential seq;
  seq.emplace<nn::Linear>(6, 8, gen);
  seq.emplace<nn::ReLU>();
  seq.emplace<nn::Linear>(8, 8, gen);
  seq.emplace<nn::GELU>();
  seq.emplace<nn::Linear>(8, 3, gen);
  for (auto& named : seq.named_parameters())
    named.parameter->value.copy_from(layers_fixture().get("seq.param." + named.name));
  return seq;
}

}  // namespace

TEST_CASE("Linear forward and backward match PyTorch autograd") {
  const auto& f = layers_fixture();
  Generator gen(1);
  nn::Linear linear(7, 4, gen);
  CHECK(linear.weight().value.shape() == Shape{4, 7});  // [out, in], as PyTorch stores it
  CHECK(linear.bias().value.shape() == Shape{4});
  linear.weight().value.copy_from(f.get("linear.weight"));
  linear.bias().value.copy_from(f.get("linear.bias"));

  const LinearBounds bound = linear_bounds(f);
  auto values = [](const Tensor& t) { return t.to_vector<float>(); };
  Tensor y = linear.forward(f.get("linear.x"));
  check_within(values(y), values(f.get("linear.y")), bound.y, "y");
  Tensor dx = linear.backward(f.get("linear.dy"));
  check_within(values(dx), values(f.get("linear.dx")), bound.dx, "dx");
  check_within(values(linear.weight().grad), values(f.get("linear.dweight")), bound.dweight, "dweight");
  check_within(values(linear.bias().grad), values(f.get("linear.dbias")), bound.dbias, "dbias");

  SUBCASE("a second backward accumulates into .grad, as PyTorch does") {
    linear.backward(f.get("linear.dy"));
    Tensor twice_w = f.get("linear.dweight").clone(), twice_b = f.get("linear.dbias").clone();
    kernels::scale(twice_w, 2.f);
    kernels::scale(twice_b, 2.f);
    check_within(values(linear.weight().grad), values(twice_w), accumulated_bound(bound.dweight, twice_w),
                 "dweight after two passes");
    check_within(values(linear.bias().grad), values(twice_b), accumulated_bound(bound.dbias, twice_b),
                 "dbias after two passes");
    linear.zero_grad(/*set_to_none=*/false);
    CHECK(kernels::sum_of_squares(linear.weight().grad) == 0.0);
    CHECK(kernels::sum_of_squares(linear.bias().grad) == 0.0);
  }
  SUBCASE("after zero_grad (set to none) the next backward overwrites, the one after accumulates") {
    linear.zero_grad();
    CHECK_FALSE(linear.weight().has_grad);
    CHECK_FALSE(linear.bias().has_grad);
    // Stale numbers, even NaN, must not leak into the new gradient (GEMM and bias_grad with beta = 0).
    kernels::fill(linear.weight().grad, std::nanf(""));
    kernels::fill(linear.bias().grad, std::nanf(""));
    linear.backward(f.get("linear.dy"), false);
    CHECK(linear.weight().has_grad);
    check_within(values(linear.weight().grad), values(f.get("linear.dweight")), bound.dweight,
                 "dweight over a stale buffer");
    check_within(values(linear.bias().grad), values(f.get("linear.dbias")), bound.dbias, "dbias over a stale buffer");
    linear.backward(f.get("linear.dy"), false);
    Tensor twice_w = f.get("linear.dweight").clone(), twice_b = f.get("linear.dbias").clone();
    kernels::scale(twice_w, 2.f);
    kernels::scale(twice_b, 2.f);
    check_within(values(linear.weight().grad), values(twice_w), accumulated_bound(bound.dweight, twice_w),
                 "dweight summed over two passes");
    check_within(values(linear.bias().grad), values(twice_b), accumulated_bound(bound.dbias, twice_b),
                 "dbias summed over two passes");
  }
  SUBCASE("want_input_grad = false skips dx but still produces the parameter gradients") {
    linear.zero_grad();
    CHECK_FALSE(linear.backward(f.get("linear.dy"), false).defined());
    check_within(values(linear.weight().grad), values(f.get("linear.dweight")), bound.dweight, "dweight");
  }
}

TEST_CASE("Linear without bias computes x W^T") {
  const auto& f = layers_fixture();
  Generator gen(1);
  nn::Linear linear(7, 4, gen, /*bias=*/false);
  CHECK(linear.named_parameters().size() == 1);
  CHECK_THROWS_AS(linear.bias(), Error);
  linear.weight().value.copy_from(f.get("linear.weight"));
  Tensor y = linear.forward(f.get("linear.x"));
  // Reference: PyTorch's y minus its bias, row by row. Ours is within the bound of x W^T, PyTorch's y
  // within the bound of x W^T + b (half of linear_bounds' y), and the subtraction rounds once.
  std::vector<float> ref = f.get("linear.y").to_vector<float>(), b = f.get("linear.bias").to_vector<float>();
  for (size_t i = 0; i < ref.size(); ++i) ref[i] -= b[i % 4];
  std::vector<double> bound = gemm_rounding_bound(f.get("linear.x"), false, f.get("linear.weight"), true);
  const std::vector<double> with_bias = linear_bounds(f).y;
  for (size_t i = 0; i < bound.size(); ++i) bound[i] += with_bias[i] / 2 + kFloatRoundoff * std::fabs(double(ref[i]));
  check_within(y.to_vector<float>(), ref, bound, "y without bias");
  CHECK(linear.describe() == "Linear(in_features=7, out_features=4, bias=False)");
}

TEST_CASE("Linear's initial weights follow PyTorch's distribution, drawn from Philox") {
  const nlohmann::json init = meta("init");
  const int64_t in = init["in_features"], out = init["out_features"];
  const double bound = init["weight_bound"];
  Generator gen(2024);
  nn::Linear linear(in, out, gen);

  // PyTorch's kaiming_uniform_(a = sqrt(5)) bound and its bias bound are both 1/sqrt(fan_in).
  CHECK(bound == doctest::Approx(1 / std::sqrt(double(in))).epsilon(1e-12));
  CHECK(double(init["bias_bound"]) == doctest::Approx(bound).epsilon(1e-12));

  std::vector<float> w = linear.weight().value.to_vector<float>();
  double sum = 0, sum_sq = 0, absmax = 0;
  for (float v : w) {
    sum += v;
    sum_sq += double(v) * v;
    absmax = std::max(absmax, std::fabs(double(v)));
  }
  const double n = double(w.size()), mean = sum / n, var = sum_sq / n - mean * mean;
  CHECK(absmax <= bound);
  CHECK(absmax > 0.99 * bound);  // the whole interval is used
  // U(-b, b) has mean 0 (sd of the sample mean: b / sqrt(3n)) and variance b^2/3 (relative sd of the
  // sample variance: sqrt(0.8/n) = 0.26% here). Both margins are over 6 standard deviations.
  CHECK(std::fabs(mean) < 6 * bound / std::sqrt(3 * n));
  CHECK(var == doctest::Approx(bound * bound / 3).epsilon(0.02));
  CHECK(var == doctest::Approx(double(init["torch_weight_var"])).epsilon(0.03));  // a PyTorch-made Linear
  CHECK(double(init["torch_weight_absmax"]) <= bound);

  // Exactly which numbers: weight element i is Philox draw i of the seed, the bias continues after it.
  Generator replay(2024);
  uint64_t weight_offset = replay.advance(uint64_t(in * out)), bias_offset = replay.advance(uint64_t(out));
  for (int64_t i : {int64_t(0), int64_t(1), int64_t(5), in * out - 1})
    CHECK(w[size_t(i)] == philox::uniform(2024, weight_offset, uint64_t(i), -float(bound), float(bound)));
  std::vector<float> b = linear.bias().value.to_vector<float>();
  for (int64_t i : {int64_t(0), out - 1})
    CHECK(b[size_t(i)] == philox::uniform(2024, bias_offset, uint64_t(i), -float(bound), float(bound)));
  CHECK(gen.offset() == replay.offset());  // the layer consumed exactly its weight and bias draws

  Generator same(2024), other(2025);
  CHECK(bitwise_equal(nn::Linear(in, out, same).weight().value, linear.weight().value));
  CHECK_FALSE(bitwise_equal(nn::Linear(in, out, other).weight().value, linear.weight().value));
}

TEST_CASE("ReLU and GELU match PyTorch, including the gradient at exactly zero") {
  const auto& f = layers_fixture();
  nn::ReLU relu;
  nn::GELU gelu;
  for (auto [name, layer] : {std::pair<const char*, nn::Module*>{"relu", &relu}, {"gelu", &gelu}}) {
    CAPTURE(name);
    std::string n = name;
    CHECK(layer->named_parameters().empty());
    check_close(layer->forward(f.get(n + ".x")), f.get(n + ".y"), kAtol, kRtol, n + ".y");
    check_close(layer->backward(f.get(n + ".dy")), f.get(n + ".dx"), kAtol, kRtol, n + ".dx");
    CHECK_FALSE(layer->backward(f.get(n + ".dy"), false).defined());
  }
  CHECK(relu.backward(layers_fixture().get("relu.dy")).item<float>(0) == 0.f);  // x[0, 0] == 0
}

TEST_CASE("Sequential names parameters as PyTorch's state_dict and matches its forward and backward") {
  const auto& f = layers_fixture();
  nn::Sequential seq = make_fixture_sequential();
  std::vector<std::string> names;
  for (auto& named : seq.named_parameters()) names.push_back(named.name);
  CHECK(names == meta("seq_names").get<std::vector<std::string>>());
  CHECK(seq.size() == 5);
  CHECK(seq.parameter_count() == (6 * 8 + 8) + (8 * 8 + 8) + (8 * 3 + 3));
  CHECK(&seq.parameter("2.bias") == &static_cast<nn::Linear&>(seq[2]).bias());
  CHECK_THROWS_WITH_AS(seq.parameter("1.weight"), doctest::Contains("0.weight, 0.bias, 2.weight"), Error);

  check_close(seq.forward(f.get("seq.x")), f.get("seq.y"), kAtol, kRtol, "seq.y");
  check_close(seq.backward(f.get("seq.dy")), f.get("seq.dx"), kAtol, kRtol, "seq.dx");
  for (auto& named : seq.named_parameters())
    check_close(named.parameter->grad, f.get("seq.grad." + named.name), kAtol, kRtol, "grad of " + named.name);

  // The first layer is not asked for the data's gradient when the caller does not want it.
  seq.forward(f.get("seq.x"));
  CHECK_FALSE(seq.backward(f.get("seq.dy"), false).defined());
}

TEST_CASE("backward announces each gradient once, last layer first: the order DDP buckets by") {
  const auto& f = layers_fixture();
  nn::Sequential seq = make_fixture_sequential();
  std::vector<std::string> ready;
  for (auto& named : seq.named_parameters()) {
    named.parameter->grad_ready_hooks.push_back([&ready, name = named.name](nn::Parameter& p) {
      // When the hook fires, the gradient must already hold its final value.
      CHECK_MESSAGE(kernels::sum_of_squares(p.grad) > 0, name << " was announced before it was computed");
      ready.push_back(name);
    });
  }
  seq.forward(f.get("seq.x"));
  seq.backward(f.get("seq.dy"), false);
  // PyTorch's autograd order for the same model, recorded by make_nn.py with hooks on the AccumulateGrad
  // nodes DDP hooks: each Linear's bias before its weight (addmm's bias gradient needs no transpose).
  CHECK(ready == meta("seq_ready_order").get<std::vector<std::string>>());
  CHECK(ready == std::vector<std::string>{"4.bias", "4.weight", "2.bias", "2.weight", "0.bias", "0.weight"});
}

TEST_CASE("Sequential describes itself as PyTorch prints it, and can be iterated") {
  Generator gen(0);
  nn::Sequential seq;
  seq.emplace<nn::Linear>(2, 3, gen);
  seq.emplace<nn::ReLU>();
  CHECK(seq.describe() == "Sequential(\n  (0): Linear(in_features=2, out_features=3, bias=True)\n  (1): ReLU()\n)");
  std::vector<std::string> seen;
  for (auto& [name, child] : seq.named_children()) seen.push_back(name + ":" + child->describe());
  CHECK(seen == std::vector<std::string>{"0:Linear(in_features=2, out_features=3, bias=True)", "1:ReLU()"});
  int count = 0;
  for (auto& child : seq) count += child->describe().empty() ? 0 : 1;
  CHECK(count == 2);
  CHECK_THROWS_AS(seq[2], Error);
}

TEST_CASE("CrossEntropyLoss and MSELoss match PyTorch's loss and gradient") {
  const auto& f = layers_fixture();
  nn::CrossEntropyLoss ce;
  CHECK_THROWS_WITH_AS(ce.backward(), doctest::Contains("before forward"), Error);
  float loss = ce.forward(f.get("ce.logits"), f.get("ce.labels"));
  CHECK(loss == doctest::Approx(f.get("ce.loss").item<float>()).epsilon(1e-6));
  check_close(ce.backward(), f.get("ce.dlogits"), kAtol, kRtol, "dlogits");
  CHECK(ce.evaluate(f.get("ce.logits"), f.get("ce.labels")) == loss);

  nn::MSELoss mse;
  loss = mse.forward(f.get("mse.pred"), f.get("mse.target"));
  CHECK(loss == doctest::Approx(f.get("mse.loss").item<float>()).epsilon(1e-6));
  check_close(mse.backward(), f.get("mse.dpred"), kAtol, kRtol, "dpred");
  CHECK(mse.evaluate(f.get("mse.pred"), f.get("mse.target")) == loss);
}

TEST_CASE("layer errors say what was wrong and what to do") {
  Generator gen(0);
  nn::Linear linear(3, 2, gen);
  CHECK_THROWS_WITH_AS(linear.backward(Tensor::zeros({4, 2})), doctest::Contains("before forward"), Error);
  CHECK_THROWS_WITH_AS(linear.forward(Tensor::zeros({4, 5})), doctest::Contains("expected input [batch, 3]"), Error);
  linear.forward(Tensor::zeros({4, 3}));
  CHECK_THROWS_WITH_AS(linear.backward(Tensor::zeros({4, 3})), doctest::Contains("expected grad_output [4, 2]"), Error);
  CHECK_THROWS_WITH_AS(nn::Linear(0, 2, gen), doctest::Contains("hint:"), Error);
  nn::ReLU relu;
  relu.forward(Tensor::zeros({2, 2}));
  CHECK_THROWS_WITH_AS(relu.backward(Tensor::zeros({2, 3})), doctest::Contains("forward input was f32[2, 2]"), Error);
}

TEST_CASE("a Linear moved to CUDA keeps bitwise the weights it had on the CPU") {
  if (cuda_device_count() == 0) {
    TINYDDP_SKIP("no CUDA device");
  }
  Generator a(5), b(5);
  nn::Linear cpu(64, 32, a), gpu(64, 32, b);
  gpu.to(Device::cuda(0));
  CHECK(gpu.weight().value.device() == Device::cuda(0));
  CHECK(gpu.weight().grad.device() == Device::cuda(0));
  CHECK(bitwise_equal(gpu.weight().value.to(Device::cpu()), cpu.weight().value));
  CHECK(bitwise_equal(gpu.bias().value.to(Device::cpu()), cpu.bias().value));
}
