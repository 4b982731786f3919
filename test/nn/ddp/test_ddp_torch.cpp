// tinyddp's DDP against PyTorch's: test/fixtures/make_ddp.py trained the same MLP with torch's
// DistributedDataParallel (gloo, two processes) from the same initial weights on the same data, shuffle
// off, and stored every rank's loss per step and the final weights (ddp_train.safetensors). Here two
// threads act as the ranks, feed their DistributedSampler's batches through a DataLoader, and must end
// with PyTorch's weights. As in the fixture, rank 1 starts from other weights, which the construction
// broadcast replaces with rank 0's.
//
//   plain    Adam(lr 0.01), one synchronised backward per step
//   no_sync  SGD(lr 0.05, momentum 0.9), two micro-batches per step, the first under no_sync()
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

#include "tinyddp/core/safetensors.h"
#include "tinyddp/nn/data/data_loader.h"
#include "tinyddp/nn/data/dataset.h"
#include "tinyddp/nn/data/distributed_sampler.h"
#include "tinyddp/nn/ddp/distributed_data_parallel.h"
#include "tinyddp/nn/optim/adam.h"
#include "tinyddp/nn/optim/sgd.h"
#include "test/nn/ddp/test_ddp_support.h"
#include "test/test_support.h"

using namespace tinyddp;
using namespace tinyddp::nn;
using namespace tinyddp::testing;

namespace {

const SafetensorsFile& ddp_fixture() {
  static const SafetensorsFile file = load_safetensors(fixture("ddp_train.safetensors"));
  return file;
}

nlohmann::json meta(const std::string& key) { return nlohmann::json::parse(ddp_fixture().metadata.at(key)); }

struct RankResult {
  std::vector<float> losses;
  std::unique_ptr<Sequential> model;
};

RankResult train_rank(const std::string& scenario, int rank, std::shared_ptr<comm::ProcessGroup> group) {
  const nlohmann::json config = meta("scenarios")[scenario];
  const int world = meta("world");
  RankResult result;
  result.model = make_mlp(meta("sizes").get<std::vector<int64_t>>(), uint64_t(rank));
  if (rank == 0)
    for (auto& named : result.model->named_parameters())
      named.parameter->value.copy_from(ddp_fixture().get("init." + named.name));
  // The fixture's bucket cap (0.0005 MiB): several small buckets.
  DistributedDataParallel ddp(*result.model, group, {.bucket_cap_mb = 0.0005});
  std::unique_ptr<Optimizer> optimizer;
  if (config["optimizer"] == "adam")
    optimizer = std::make_unique<Adam>(ddp.named_parameters(), config["lr"].get<double>());
  else
    optimizer = std::make_unique<SGD>(ddp.named_parameters(), config["lr"].get<double>(),
                                      config["momentum"].get<double>());

  auto data = std::make_shared<TensorDataset>(ddp_fixture().get("x"), ddp_fixture().get("y"));
  auto sampler = std::make_shared<DistributedSampler>(data->size(), world, rank,
                                                      DistributedSamplerOptions{.shuffle = false});
  CHECK(sampler->indices() == meta("order")[std::to_string(rank)].get<std::vector<int64_t>>());
  DataLoader loader(data, {.batch_size = meta("batch").get<int64_t>(), .prefetch = false}, sampler);

  const int micro_batches = config["micro_batches"];
  int micro = 0;
  CrossEntropyLoss criterion;
  for (const Batch& batch : loader) {
    if (micro == 0) optimizer->zero_grad();
    const bool last = micro + 1 == micro_batches;
    auto step = [&] {
      result.losses.push_back(criterion.forward(ddp.forward(batch.inputs), batch.targets));
      ddp.backward(criterion.backward(), false);
    };
    if (last) {
      step();
      optimizer->step();
    } else {
      auto guard = ddp.no_sync();
      step();
    }
    micro = last ? 0 : micro + 1;
  }
  return result;
}

void check_scenario(const std::string& scenario) {
  auto groups = make_test_groups(2);
  std::vector<RankResult> results(2);
  run_ranks(2, [&](int rank) { results[size_t(rank)] = train_rank(scenario, rank, groups[size_t(rank)]); });
  for (int rank = 0; rank < 2; ++rank) {
    // Each rank's loss on its own micro-batch, step by step: both the data split and the weights agree.
    check_close(results[size_t(rank)].losses,
                ddp_fixture().get(scenario + ".loss.rank" + std::to_string(rank)).to_vector<float>(), 2e-5, 2e-4,
                scenario + " losses of rank " + std::to_string(rank));
    for (auto& named : results[size_t(rank)].model->named_parameters())
      check_close(named.parameter->value, ddp_fixture().get(scenario + ".final." + named.name), 2e-5, 2e-4,
                  scenario + " rank " + std::to_string(rank) + " " + named.name);
  }
  CHECK(flat_values(*results[0].model) == flat_values(*results[1].model));
}

}  // namespace

TEST_CASE("DDP with Adam ends with PyTorch DDP's weights, and every rank's loss matches at every step") {
  check_scenario("plain");
}

TEST_CASE("DDP with no_sync gradient accumulation and SGD momentum ends with PyTorch DDP's weights") {
  check_scenario("no_sync");
}
