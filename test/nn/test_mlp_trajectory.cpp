// End to end: a 12-16-16-3 ReLU MLP trained with CrossEntropy for 10 steps gives PyTorch's loss at
// every step and its final weights (test/fixtures/make_nn.py -> nn_mlp.safetensors), with Adam alone
// and with AdamW + gradient clipping + warm-up/cosine composed as a trainer uses them. Also: gradient
// accumulation over two backward passes, and bitwise determinism from a seed.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

#include "tinyddp/core/random.h"
#include "tinyddp/core/safetensors.h"
#include "tinyddp/nn/activations.h"
#include "tinyddp/nn/linear.h"
#include "tinyddp/nn/loss.h"
#include "tinyddp/nn/optim/adam.h"
#include "tinyddp/nn/optim/clip.h"
#include "tinyddp/nn/optim/schedulers.h"
#include "tinyddp/nn/sequential.h"
#include "test/test_support.h"

using namespace tinyddp;
using tinyddp::testing::check_close;
using tinyddp::testing::fixture;

namespace {

const SafetensorsFile& mlp_fixture() {
  static const SafetensorsFile file = load_safetensors(fixture("nn_mlp.safetensors"));
  return file;
}

nlohmann::json meta(const std::string& key) { return nlohmann::json::parse(mlp_fixture().metadata.at(key)); }

nn::Sequential make_mlp(uint64_t seed) {
  Generator gen(seed);
  nn::Sequential mlp;
  mlp.emplace<nn::Linear>(12, 16, gen);
  mlp.emplace<nn::ReLU>();
  mlp.emplace<nn::Linear>(16, 16, gen);
  mlp.emplace<nn::ReLU>();
  mlp.emplace<nn::Linear>(16, 3, gen);
  return mlp;
}

// The MLP with PyTorch's initial weights.
nn::Sequential make_fixture_mlp() {
  nn::Sequential mlp = make_mlp(0);
  for (auto& named : mlp.named_parameters()) named.parameter->value.copy_from(mlp_fixture().get("init." + named.name));
  return mlp;
}

// One full-batch step of the usual loop; returns the loss of the forward pass.
float forward_backward(nn::Sequential& mlp, nn::CrossEntropyLoss& criterion, const Tensor& x, const Tensor& labels) {
  float loss = criterion.forward(mlp.forward(x), labels);
  mlp.backward(criterion.backward(), /*want_input_grad=*/false);
  return loss;
}

// Ten steps compound float32 rounding through Adam's normalisation, so the tolerance is looser than
// for a single layer, yet far below what a wrong formula or a missed step would give.
constexpr double kAtol = 2e-5, kRtol = 2e-4;

void check_final_weights(nn::Sequential& mlp, const std::string& prefix) {
  for (auto& named : mlp.named_parameters())
    check_close(named.parameter->value, mlp_fixture().get(prefix + named.name), kAtol, kRtol, prefix + named.name);
}

}  // namespace

TEST_CASE("the MLP's parameter names are PyTorch's state_dict keys") {
  nn::Sequential mlp = make_mlp(0);
  std::vector<std::string> names;
  for (auto& named : mlp.named_parameters()) names.push_back(named.name);
  CHECK(names == meta("names").get<std::vector<std::string>>());
}

TEST_CASE("10 Adam steps of an MLP give PyTorch's loss at every step and its final weights") {
  const auto& f = mlp_fixture();
  const nlohmann::json settings = meta("adam");
  nn::Sequential mlp = make_fixture_mlp();
  nn::CrossEntropyLoss criterion;
  nn::Adam adam(mlp.named_parameters(), settings["lr"]);
  std::vector<float> losses;
  for (int step = 0; step < settings["steps"].get<int>(); ++step) {
    adam.zero_grad();
    losses.push_back(forward_backward(mlp, criterion, f.get("x"), f.get("labels")));
    adam.step();
  }
  check_close(losses, f.get("adam.losses").to_vector<float>(), kAtol, kRtol, "loss per step");
  check_final_weights(mlp, "adam.final.");
}

TEST_CASE("AdamW + clip_grad_norm + warm-up then cosine, composed, follow PyTorch for 10 steps") {
  const auto& f = mlp_fixture();
  const nlohmann::json c = meta("composed");
  nn::Sequential mlp = make_fixture_mlp();
  nn::CrossEntropyLoss criterion;
  nn::AdamW adamw(mlp.named_parameters(), c["lr"], {0.9, 0.999}, 1e-8, c["weight_decay"]);
  nn::SequentialSchedule schedule(adamw,
                                  {std::make_shared<nn::WarmUp>(adamw, c["warmup_iters"], c["start_factor"]),
                                   std::make_shared<nn::CosineAnnealing>(adamw, c["total_iters"], c["eta_min"])},
                                  {c["warmup_iters"].get<int64_t>()});
  std::vector<float> losses, norms;
  std::vector<double> lrs;
  for (int step = 0; step < c["steps"].get<int>(); ++step) {
    adamw.zero_grad();
    losses.push_back(forward_backward(mlp, criterion, f.get("x"), f.get("labels")));
    norms.push_back(float(nn::clip_grad_norm(mlp.parameters(), c["max_norm"])));
    lrs.push_back(adamw.lr());
    adamw.step();
    schedule.step();
  }
  std::vector<double> ref_lrs = f.get("composed.lrs").to_vector<double>();
  REQUIRE(lrs.size() == ref_lrs.size());
  for (size_t i = 0; i < lrs.size(); ++i) CHECK(lrs[i] == doctest::Approx(ref_lrs[i]).epsilon(1e-12));
  check_close(norms, f.get("composed.grad_norms").to_vector<float>(), kAtol, kRtol, "gradient norm per step");
  check_close(losses, f.get("composed.losses").to_vector<float>(), kAtol, kRtol, "loss per step");
  check_final_weights(mlp, "composed.final.");
  // Clipping really happened on some steps and not on others, so both paths were compared.
  int clipped = 0;
  for (float n : norms) clipped += n > c["max_norm"].get<float>() ? 1 : 0;
  CHECK(clipped > 0);
  CHECK(clipped < int(norms.size()));
}

TEST_CASE("two backward passes without zero_grad accumulate PyTorch's summed gradients") {
  const auto& f = mlp_fixture();
  nn::Sequential mlp = make_fixture_mlp();
  nn::CrossEntropyLoss criterion;
  // Two micro-batches of 16: each loss is its own mean, and the gradients add up -- the gradient
  // accumulation that DDP's no_sync() builds on.
  forward_backward(mlp, criterion, f.get("x").slice_rows(0, 16), f.get("labels").slice_rows(0, 16));
  forward_backward(mlp, criterion, f.get("x").slice_rows(16, 32), f.get("labels").slice_rows(16, 32));
  for (auto& named : mlp.named_parameters())
    check_close(named.parameter->grad, f.get("accum." + named.name), 1e-6, 1e-5, "accumulated grad of " + named.name);
}

TEST_CASE("two runs from one seed give bitwise-equal weights; another seed does not") {
  const auto& f = mlp_fixture();
  auto train = [&](uint64_t seed) {
    auto mlp = std::make_unique<nn::Sequential>(make_mlp(seed));
    nn::CrossEntropyLoss criterion;
    nn::Adam adam(mlp->named_parameters(), 1e-2);
    for (int step = 0; step < 5; ++step) {
      adam.zero_grad();
      forward_backward(*mlp, criterion, f.get("x"), f.get("labels"));
      adam.step();
    }
    return mlp;
  };
  auto a = train(42), b = train(42), c = train(43);
  auto pa = a->named_parameters(), pb = b->named_parameters(), pc = c->named_parameters();
  bool all_differ = true;
  for (size_t i = 0; i < pa.size(); ++i) {
    CHECK_MESSAGE(bitwise_equal(pa[i].parameter->value, pb[i].parameter->value), pa[i].name);
    all_differ = all_differ && !bitwise_equal(pa[i].parameter->value, pc[i].parameter->value);
  }
  CHECK(all_differ);
}
