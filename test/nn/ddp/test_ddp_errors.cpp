// DistributedDataParallel's checks and find_unused_parameters, with threads acting as ranks: replicas
// that differ, a gradient marked ready twice, a gradient never marked, and a layer that runs on some
// ranks only. Every error must name what was wrong (the rank, the parameter) and say what to do.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "tinyddp/kernels/ops.h"
#include "tinyddp/nn/ddp/distributed_data_parallel.h"
#include "tinyddp/nn/loss.h"
#include "test/nn/ddp/test_ddp_support.h"
#include "test/test_support.h"

using namespace tinyddp;
using namespace tinyddp::nn;
using namespace tinyddp::testing;

namespace {

// Linear(4, 3), then Linear(3, 3) only when use_second is set: a model whose layers do not all run.
class SkippableHead : public Module {
 public:
  explicit SkippableHead(Generator& gen) : first_(4, 3, gen), second_(3, 3, gen) {}
  bool use_second = true;

  Tensor forward(const Tensor& x) override {
    Tensor h = first_.forward(x);
    return use_second ? second_.forward(h) : h;
  }
  Tensor backward(const Tensor& grad, bool want_input_grad) override {
    Tensor g = use_second ? second_.backward(grad, true) : grad;
    return first_.backward(g, want_input_grad);
  }
  std::string describe() const override { return "SkippableHead"; }
  std::vector<NamedParameter> named_parameters() override {
    std::vector<NamedParameter> out;
    for (auto& p : first_.named_parameters()) out.push_back({"first." + p.name, p.parameter});
    for (auto& p : second_.named_parameters()) out.push_back({"second." + p.name, p.parameter});
    return out;
  }

 private:
  Linear first_, second_;
};

// One MSE step of `model` on rank-specific data.
void mse_step(Module& model, int rank) {
  MSELoss criterion;
  Tensor x = random_features(2, 4, 40 + uint64_t(rank));
  Tensor target = random_features(2, 3, 50 + uint64_t(rank));
  criterion.forward(model.forward(x), target);
  model.backward(criterion.backward(), false);
}

std::vector<float> grad_of(Module& model, const std::string& name) {
  return model.parameter(name).grad.to_vector<float>();
}

}  // namespace

TEST_CASE("replicas that differ in a shape or in their parameter count are refused on every rank, naming both") {
  auto groups = make_test_groups(2);
  std::vector<std::string> errors(2);
  run_ranks(2, [&](int rank) {
    auto model = make_mlp(rank == 0 ? std::vector<int64_t>{12, 16, 3} : std::vector<int64_t>{12, 15, 3}, 0);
    try {
      DistributedDataParallel ddp(*model, groups[size_t(rank)]);
    } catch (const Error& e) {
      errors[size_t(rank)] = e.what();
    }
  });
  for (const std::string& e : errors) {
    CHECK(e.find("the model on rank 1 differs from rank 0's: parameter #0 is '0.weight' f32[15, 12] on rank 1 but "
                 "'0.weight' f32[16, 12] on rank 0") != std::string::npos);
    CHECK(e.find("hint: build the same model") != std::string::npos);
  }

  auto more = make_test_groups(2);
  run_ranks(2, [&](int rank) {
    auto model = make_mlp(rank == 0 ? std::vector<int64_t>{4, 3} : std::vector<int64_t>{4, 3, 3}, 0);
    CHECK_THROWS_WITH([&] { DistributedDataParallel ddp(*model, more[size_t(rank)]); }(),
                      doctest::Contains("parameter #2 is '2.weight' f32[3, 3] on rank 1 but nothing (it has only 2) "
                                        "on rank 0"));
  });
}

TEST_CASE("a gradient marked ready twice in one backward pass is an error naming the parameter") {
  auto groups = make_test_groups(2);
  run_ranks(2, [&](int rank) {
    ScriptedModule module({4, 4, 4}, rank);
    DistributedDataParallel ddp(module, groups[size_t(rank)]);
    module.mark_order = {2, 1, 1};
    ddp.forward(Tensor::zeros({1}));
    const std::string expected = "parameter 'p1' was marked ready twice in one backward pass on rank " +
                                 std::to_string(rank);
    CHECK_THROWS_WITH(ddp.backward(Tensor::zeros({1})), doctest::Contains(expected.c_str()));
    CHECK_FALSE(ddp.reducer().armed());
    // The next iteration starts cleanly.
    module.mark_order = {2, 1, 0};
    ddp.forward(Tensor::zeros({1}));
    ddp.backward(Tensor::zeros({1}));
    CHECK(ddp.reducer().iterations() == 1);
  });
}

TEST_CASE("a parameter that gets no gradient is an error naming it and suggesting find_unused_parameters") {
  auto groups = make_test_groups(2);
  run_ranks(2, [&](int rank) {
    Generator gen(1);
    SkippableHead model(gen);
    DistributedDataParallel ddp(model, groups[size_t(rank)]);
    model.use_second = false;
    const std::string expected = "2 parameter(s) got no gradient in this backward pass on rank " +
                                 std::to_string(rank) + ": 'second.weight', 'second.bias'";
    CHECK_THROWS_WITH(mse_step(ddp, rank), doctest::Contains(expected.c_str()));
    CHECK_THROWS_WITH(mse_step(ddp, rank), doctest::Contains("hint: pass find_unused_parameters = true"));
    // With every layer running again, training goes on.
    model.use_second = true;
    mse_step(ddp, rank);
    CHECK(ddp.reducer().iterations() == 1);
  });
}

TEST_CASE("find_unused_parameters: a layer used on one rank only gets the average of its gradient and zero") {
  auto groups = make_test_groups(2);
  std::vector<std::vector<float>> first_weight(2), second_weight(2);
  run_ranks(2, [&](int rank) {
    Generator gen(2);
    SkippableHead model(gen);
    DistributedDataParallel ddp(model, groups[size_t(rank)], {.find_unused_parameters = true});
    model.use_second = rank == 0;
    mse_step(ddp, rank);
    first_weight[size_t(rank)] = grad_of(model, "first.weight");
    second_weight[size_t(rank)] = grad_of(model, "second.weight");
    CHECK_FALSE(ddp.reducer().buckets_rebuilt());  // as in PyTorch: no rebuild with find_unused_parameters
  });
  // References: the same model and data in one process, per rank, averaged as the all-reduce averages
  // (rank 1 contributing zeros for the layer it skipped): the same roundings, so the same bits.
  Generator gen(2);
  SkippableHead model(gen);
  std::vector<float> expected = gradients_as_ddp_averages(model, 2, [&](int rank) {
    model.use_second = rank == 0;
    mse_step(model, rank);
    if (rank == 1) CHECK_FALSE(model.parameter("second.weight").has_grad);
  });
  // Flat in registration order: first.weight [3, 4], first.bias [3], second.weight [3, 3], second.bias [3].
  const std::vector<float> expected_first(expected.begin(), expected.begin() + 12);
  const std::vector<float> expected_second(expected.begin() + 15, expected.begin() + 24);
  for (int rank = 0; rank < 2; ++rank) {
    check_identical(first_weight[size_t(rank)], expected_first, "first.weight");
    check_identical(second_weight[size_t(rank)], expected_second, "second.weight");
  }
}

TEST_CASE("find_unused_parameters after zero_grad: a gradient set to none contributes zeros, not stale numbers") {
  auto groups = make_test_groups(2);
  std::vector<std::vector<float>> second_weight(2);
  // char, not bool: std::vector<bool> packs both ranks' flags into one word, and the two rank threads
  // writing their own flag race on it (ThreadSanitizer: data race in std::_Bit_reference::operator=).
  std::vector<char> second_has_grad(2);
  run_ranks(2, [&](int rank) {
    Generator gen(2);
    SkippableHead model(gen);
    DistributedDataParallel ddp(model, groups[size_t(rank)], {.find_unused_parameters = true});
    mse_step(ddp, rank);  // every layer runs: every bucket place holds a gradient now
    ddp.zero_grad();      // set to none: the numbers stay in the buckets; poison them
    for (const NamedParameter& named : ddp.named_parameters()) kernels::fill(named.parameter->grad, std::nanf(""));
    model.use_second = rank == 0;
    mse_step(ddp, rank);
    second_weight[size_t(rank)] = grad_of(model, "second.weight");
    second_has_grad[size_t(rank)] = model.parameter("second.weight").has_grad;
  });
  // Rank 1 skipped the layer: the average is rank 0's gradient plus zeros, halved (as in the test above).
  Generator gen(2);
  SkippableHead alone(gen);
  std::vector<float> expected = gradients_as_ddp_averages(alone, 2, [&](int rank) {
    alone.use_second = rank == 0;
    mse_step(alone, rank);
  });
  expected = std::vector<float>(expected.begin() + 15, expected.begin() + 24);  // second.weight
  for (int rank = 0; rank < 2; ++rank) {
    check_identical(second_weight[size_t(rank)], expected, "second.weight");
    CHECK(second_has_grad[size_t(rank)]);
  }
}

TEST_CASE("find_unused_parameters with a layer no rank uses: its gradient stays zero and training goes on") {
  auto groups = make_test_groups(2);
  run_ranks(2, [&](int rank) {
    Generator gen(3);
    SkippableHead model(gen);
    DistributedDataParallel ddp(model, groups[size_t(rank)], {.find_unused_parameters = true});
    model.use_second = false;
    for (int step = 0; step < 2; ++step) {
      ddp.zero_grad();
      mse_step(ddp, rank);
    }
    CHECK(grad_of(model, "second.weight") == std::vector<float>(9, 0.f));
    CHECK(grad_of(model, "second.bias") == std::vector<float>(3, 0.f));
    CHECK(ddp.reducer().iterations() == 2);
  });
}
