// SGD, Adam and AdamW trajectories against torch.optim, step by step, from the same gradients
// (test/fixtures/make_nn.py -> nn_optim.safetensors); clip_grad_norm against clip_grad_norm_
// (nn_layers.safetensors); and the optimizer state a checkpoint saves and restores.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

#include "tinyddp/core/random.h"
#include "tinyddp/core/safetensors.h"
#include "tinyddp/kernels/ops.h"
#include "tinyddp/nn/linear.h"
#include "tinyddp/nn/optim/adam.h"
#include "tinyddp/nn/optim/clip.h"
#include "tinyddp/nn/optim/sgd.h"
#include "tinyddp/nn/sequential.h"
#include "test/test_support.h"

using namespace tinyddp;
using tinyddp::testing::check_close;
using tinyddp::testing::fixture;

namespace {

const SafetensorsFile& optim_fixture() {
  static const SafetensorsFile file = load_safetensors(fixture("nn_optim.safetensors"));
  return file;
}

// Builds the optimizer a fixture case describes, from the JSON make_nn.py stored with it.
std::unique_ptr<nn::Optimizer> make_optimizer(const nlohmann::json& c, std::vector<nn::NamedParameter> params) {
  const nlohmann::json& a = c["args"];
  const std::string kind = c["kind"];
  if (kind == "sgd")
    return std::make_unique<nn::SGD>(params, a["lr"], a.value("momentum", 0.0), a.value("dampening", 0.0),
                                     a.value("weight_decay", 0.0), a.value("nesterov", false));
  std::vector<double> betas = a.value("betas", std::vector<double>{0.9, 0.999});
  if (kind == "adam")
    return std::make_unique<nn::Adam>(params, a["lr"], std::pair{betas[0], betas[1]}, a.value("eps", 1e-8),
                                      a.value("weight_decay", 0.0));
  REQUIRE(kind == "adamw");
  return std::make_unique<nn::AdamW>(params, a["lr"], std::pair{betas[0], betas[1]}, a.value("eps", 1e-8),
                                     a.value("weight_decay", 1e-2));
}

// Row `step` of a stacked [steps, ...] fixture tensor, as a view with the per-step shape.
Tensor step_row(const Tensor& stacked, int64_t step) {
  Shape shape(stacked.shape().begin() + 1, stacked.shape().end());
  return stacked.slice_rows(step, step + 1).reshape(shape);
}

nn::Parameter make_parameter(const Tensor& value) {
  nn::Parameter p;
  p.value = value.clone();
  p.grad = Tensor::zeros(value.shape());
  p.has_grad = true;  // the tests write the gradients themselves
  return p;
}

nn::Sequential small_model(uint64_t seed) {
  Generator gen(seed);
  nn::Sequential model;
  model.emplace<nn::Linear>(4, 3, gen);
  model.emplace<nn::Linear>(3, 2, gen);
  return model;
}

// Gives every gradient of `model` deterministic values that change with `step`.
void fake_gradients(nn::Module& model, int step) {
  Generator gen(1000 + uint64_t(step));
  for (nn::Parameter* p : model.parameters()) {
    fill_uniform(p->grad, -1.f, 1.f, gen);
    p->has_grad = true;
  }
}

}  // namespace

TEST_CASE("SGD, Adam and AdamW follow torch.optim's trajectories") {
  const auto& f = optim_fixture();
  const nlohmann::json cases = nlohmann::json::parse(f.metadata.at("cases"));
  const int64_t steps = nlohmann::json::parse(f.metadata.at("steps")).get<int64_t>();
  REQUIRE(cases.size() == 7);
  for (auto& [name, c] : cases.items()) {
    CAPTURE(name);
    nn::Parameter a = make_parameter(f.get("init.a")), b = make_parameter(f.get("init.b"));
    auto optimizer = make_optimizer(c, {{"a", &a}, {"b", &b}});
    CHECK(optimizer->kind() == c["kind"].get<std::string>());
    for (int64_t step = 0; step < steps; ++step) {
      const std::string key = std::to_string(step);
      if (c["lr_changes"].contains(key)) optimizer->set_lr(c["lr_changes"][key].get<double>());
      a.grad.copy_from(step_row(f.get("grad.a"), step));
      b.grad.copy_from(step_row(f.get("grad.b"), step));
      optimizer->step();
      CHECK(optimizer->step_count() == step + 1);
      // f32 arithmetic in both; Adam's sqrt and division differ from PyTorch's by an ulp or two.
      check_close(a.value, step_row(f.get(name + ".a"), step), 1e-6, 1e-5, name + ".a step " + key);
      check_close(b.value, step_row(f.get(name + ".b"), step), 1e-6, 1e-5, name + ".b step " + key);
    }
  }
}

TEST_CASE("optimizers keep PyTorch's defaults and refuse invalid settings") {
  nn::Sequential model = small_model(0);
  nn::Adam adam(model.named_parameters());
  CHECK(adam.lr() == 1e-3);
  CHECK(adam.betas() == std::pair{0.9, 0.999});
  CHECK(adam.eps() == 1e-8);
  CHECK(adam.weight_decay() == 0);
  nn::AdamW adamw(model.named_parameters());
  CHECK(adamw.weight_decay() == 1e-2);
  CHECK(adamw.kind() == "adamw");

  CHECK_THROWS_WITH_AS(nn::SGD(model.named_parameters(), 0.1, 0.9, 0.1, 0, true), doctest::Contains("Nesterov"), Error);
  CHECK_THROWS_WITH_AS(nn::SGD(model.named_parameters(), -1.0), doctest::Contains("invalid learning rate"), Error);
  CHECK_THROWS_WITH_AS(nn::Adam(model.named_parameters(), 1e-3, {0.9, 1.0}), doctest::Contains("index 1"), Error);
  CHECK_THROWS_WITH_AS(nn::Adam({}, 1e-3), doctest::Contains("empty parameter list"), Error);
  auto twice = model.named_parameters();
  twice.push_back(twice.front());
  CHECK_THROWS_WITH_AS(nn::Adam(twice, 1e-3), doctest::Contains("appears twice"), Error);
}

TEST_CASE("state_tensors names the state after the parameters and lists it before the first step") {
  nn::Sequential model = small_model(0);
  nn::Adam adam(model.named_parameters());
  auto state = adam.state_tensors();
  REQUIRE(state.size() == 8);
  CHECK(state[0].first == "exp_avg.0.weight");
  CHECK(state[1].first == "exp_avg_sq.0.weight");
  CHECK(state[7].first == "exp_avg_sq.1.bias");
  CHECK(state[0].second.shape() == Shape{3, 4});
  CHECK(kernels::sum_of_squares(state[0].second) == 0.0);

  nn::SGD momentum(model.named_parameters(), 0.1, 0.9);
  auto buffers = momentum.state_tensors();
  REQUIRE(buffers.size() == 4);
  CHECK(buffers[2].first == "momentum_buffer.1.weight");
  CHECK(nn::SGD(model.named_parameters(), 0.1).state_tensors().empty());  // plain SGD has no state
}

TEST_CASE("restoring state_tensors and the step count resumes a run bitwise") {
  for (std::string kind : {"adam", "sgd"}) {
    CAPTURE(kind);
    auto make = [&](nn::Module& m) -> std::unique_ptr<nn::Optimizer> {
      if (kind == "adam") return std::make_unique<nn::Adam>(m.named_parameters(), 1e-2);
      return std::make_unique<nn::SGD>(m.named_parameters(), 1e-2, 0.9);
    };
    // Reference: six uninterrupted steps.
    nn::Sequential straight = small_model(3);
    auto opt = make(straight);
    for (int step = 0; step < 6; ++step) fake_gradients(straight, step), opt->step();

    // Three steps, a "checkpoint" of weights and state, a fresh model and optimizer, three more steps.
    nn::Sequential first = small_model(3);
    auto opt1 = make(first);
    for (int step = 0; step < 3; ++step) fake_gradients(first, step), opt1->step();
    nn::Sequential resumed = small_model(99);
    auto opt2 = make(resumed);
    auto from = first.named_parameters(), to = resumed.named_parameters();
    for (size_t i = 0; i < from.size(); ++i) to[i].parameter->value.copy_from(from[i].parameter->value);
    auto saved = opt1->state_tensors(), restored = opt2->state_tensors();
    REQUIRE(saved.size() == restored.size());
    for (size_t i = 0; i < saved.size(); ++i) restored[i].second.copy_from(saved[i].second);
    opt2->set_step_count(opt1->step_count());
    for (int step = 3; step < 6; ++step) fake_gradients(resumed, step), opt2->step();

    auto want = straight.named_parameters(), got = resumed.named_parameters();
    for (size_t i = 0; i < want.size(); ++i)
      CHECK_MESSAGE(bitwise_equal(got[i].parameter->value, want[i].parameter->value), want[i].name);
  }
}

TEST_CASE("zero_grad sets the gradients to none by default, or to zeros in place") {
  nn::Sequential model = small_model(0);
  nn::SGD sgd(model.named_parameters(), 0.1);
  fake_gradients(model, 0);
  Tensor handle = model.parameters()[0]->grad;  // DDP's bucket views must stay valid: same memory

  SUBCASE("set_to_none (PyTorch 2's default): forgotten, and step() leaves the parameters alone") {
    std::vector<std::vector<float>> before;
    for (nn::Parameter* p : model.parameters()) before.push_back(p->value.to_vector<float>());
    sgd.zero_grad();
    for (nn::Parameter* p : model.parameters()) CHECK_FALSE(p->has_grad);
    sgd.step();  // PyTorch skips a None .grad: no update at all
    for (size_t i = 0; i < before.size(); ++i) CHECK(model.parameters()[i]->value.to_vector<float>() == before[i]);
  }
  SUBCASE("set_to_none = false (PyTorch 1's default): zeros, written in place") {
    sgd.zero_grad(/*set_to_none=*/false);
    for (nn::Parameter* p : model.parameters()) {
      CHECK(p->has_grad);
      CHECK(kernels::sum_of_squares(p->grad) == 0.0);
    }
  }
  CHECK(handle.shares_storage_with(model.parameters()[0]->grad));
}

TEST_CASE("clip_grad_norm matches torch.nn.utils.clip_grad_norm_") {
  const SafetensorsFile f = load_safetensors(fixture("nn_layers.safetensors"));
  const nlohmann::json max_norms = nlohmann::json::parse(f.metadata.at("clip_max_norm"));
  for (std::string which : {"clipped", "unclipped"}) {
    CAPTURE(which);
    std::vector<nn::Parameter> params;
    for (int i = 0; i < 3; ++i) {
      params.push_back(make_parameter(f.get("clip.grad" + std::to_string(i))));
      params.back().grad.copy_from(f.get("clip.grad" + std::to_string(i)));
    }
    std::vector<nn::Parameter*> pointers;
    for (auto& p : params) pointers.push_back(&p);
    double total = nn::clip_grad_norm(pointers, max_norms[which].get<double>());
    CHECK(total == doctest::Approx(f.get("clip." + which + ".total_norm").item<float>()).epsilon(1e-6));
    for (int i = 0; i < 3; ++i)
      check_close(params[size_t(i)].grad, f.get("clip." + which + ".grad" + std::to_string(i)), 1e-7, 1e-6,
                  which + " grad" + std::to_string(i));
  }
  // The fixture exercises both branches: one norm above its max_norm, one below.
  CHECK(f.get("clip.clipped.total_norm").item<float>() > max_norms["clipped"].get<double>());
  CHECK(f.get("clip.unclipped.total_norm").item<float>() < max_norms["unclipped"].get<double>());
}
