// DistributedSampler: with shuffling off, every rank's indices equal PyTorch's DistributedSampler for
// several (n, world, drop_last) (test/fixtures/make_ddp.py -> ddp_sampler.safetensors). With shuffling
// on, PyTorch draws torch.randperm from a Mersenne-Twister generator seeded with seed + epoch, which we
// do not reproduce (our orders come from Philox); there the tests check the properties that make data
// parallelism correct instead: the ranks' shares together are a permutation of the padded (or cut)
// data set, every rank computes the same order, the order changes with the epoch and the seed, and is
// the same every time it is asked for.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <vector>

#include "tinyddp/core/safetensors.h"
#include "tinyddp/nn/data/data_loader.h"
#include "tinyddp/nn/data/dataset.h"
#include "tinyddp/nn/data/distributed_sampler.h"
#include "test/test_support.h"

using namespace tinyddp;
using namespace tinyddp::nn;
using Indices = std::vector<int64_t>;

namespace {

// The epoch's full order, rebuilt from the ranks' shares: entry i*W + r is rank r's i-th index.
Indices interleave(int64_t n, int world, DistributedSamplerOptions options, int64_t epoch) {
  std::vector<Indices> shares;
  for (int r = 0; r < world; ++r) {
    DistributedSampler sampler(n, world, r, options);
    sampler.set_epoch(epoch);
    shares.push_back(sampler.indices());
    REQUIRE(int64_t(shares.back().size()) == sampler.size());
  }
  Indices order;
  for (size_t i = 0; i < shares[0].size(); ++i)
    for (int r = 0; r < world; ++r) order.push_back(shares[size_t(r)][i]);
  return order;
}

}  // namespace

TEST_CASE("shuffle off: every rank's indices equal PyTorch's DistributedSampler") {
  SafetensorsFile file = load_safetensors(tinyddp::testing::fixture("ddp_sampler.safetensors"));
  auto cases = nlohmann::json::parse(file.metadata.at("cases"));
  REQUIRE(cases.size() >= 10);
  for (size_t k = 0; k < cases.size(); ++k) {
    const auto& c = cases[k];
    const int64_t n = c["n"];
    const int world = c["world"];
    const bool drop_last = c["drop_last"];
    CAPTURE(n);
    CAPTURE(world);
    CAPTURE(drop_last);
    for (int r = 0; r < world; ++r) {
      DistributedSampler sampler(n, world, r, {.shuffle = false, .drop_last = drop_last});
      CHECK(sampler.size() == c["num_samples"].get<int64_t>());
      CHECK(sampler.indices() ==
            file.get("case" + std::to_string(k) + ".rank" + std::to_string(r)).to_vector<int64_t>());
    }
  }
}

TEST_CASE("shuffle off by hand: rank r gets r, r+W, r+2W, ..., padded by wrapping or cut with drop_last") {
  const DistributedSamplerOptions off{.shuffle = false};
  CHECK(DistributedSampler(10, 3, 0, off).indices() == Indices{0, 3, 6, 9});
  CHECK(DistributedSampler(10, 3, 1, off).indices() == Indices{1, 4, 7, 0});
  CHECK(DistributedSampler(10, 3, 2, off).indices() == Indices{2, 5, 8, 1});
  const DistributedSamplerOptions cut{.shuffle = false, .drop_last = true};
  CHECK(DistributedSampler(10, 3, 1, cut).indices() == Indices{1, 4, 7});
  CHECK(DistributedSampler(10, 3, 1, cut).size() == 3);
  // Fewer samples than ranks: the order wraps around as many times as needed.
  CHECK(DistributedSampler(2, 5, 4, off).indices() == Indices{0});
  CHECK(DistributedSampler(2, 5, 3, off).indices() == Indices{1});
  CHECK(DistributedSampler(2, 5, 3, cut).indices().empty());
  DistributedSampler sampler(10, 3, 2, off);
  CHECK(sampler.total_size() == 12);
  sampler.set_epoch(7);  // no effect without shuffling
  CHECK(sampler.indices() == Indices{2, 5, 8, 1});
}

TEST_CASE("shuffle on: the ranks' shares form one permutation of the padded or cut data set") {
  struct Case {
    int64_t n;
    int world;
    bool drop_last;
  };
  for (Case c : {Case{100, 4, false}, Case{101, 4, false}, Case{101, 4, true}, Case{7, 3, false}, Case{3, 5, false},
                 Case{50, 1, false}}) {
    CAPTURE(c.n);
    CAPTURE(c.world);
    CAPTURE(c.drop_last);
    DistributedSamplerOptions options{.shuffle = true, .seed = 11, .drop_last = c.drop_last};
    Indices order = interleave(c.n, c.world, options, 0);
    const int64_t total = DistributedSampler(c.n, c.world, 0, options).total_size();
    REQUIRE(int64_t(order.size()) == total);
    if (c.drop_last) {
      // A cut order: distinct samples, total of them.
      CHECK(std::set<int64_t>(order.begin(), order.end()).size() == size_t(total));
    } else {
      // The first n entries are a permutation of 0..n-1; the padding repeats the start of that order.
      Indices head(order.begin(), order.begin() + std::min<int64_t>(c.n, total));
      Indices sorted = head;
      std::sort(sorted.begin(), sorted.end());
      Indices expected(size_t(c.n));
      std::iota(expected.begin(), expected.end(), int64_t(0));
      CHECK(sorted == expected);
      for (int64_t i = c.n; i < total; ++i) CHECK(order[size_t(i)] == head[size_t(i % c.n)]);
    }
    for (int64_t index : order) CHECK((index >= 0 && index < c.n));
  }
}

TEST_CASE("shuffle on: the order comes from seed + epoch only: deterministic, new per epoch and per seed") {
  DistributedSamplerOptions options{.shuffle = true, .seed = 3};
  DistributedSampler a(200, 2, 1, options), b(200, 2, 1, options);
  CHECK(a.indices() == a.indices());  // asking twice changes nothing
  CHECK(a.indices() == b.indices());  // another object (another process) computes the same
  Indices epoch0 = a.indices();
  a.set_epoch(1);
  CHECK(a.indices() != epoch0);
  a.set_epoch(0);
  CHECK(a.indices() == epoch0);
  // The permutation of (seed, epoch) is what seed + epoch gives: seed 3 epoch 1 equals seed 4 epoch 0.
  DistributedSampler c(200, 2, 1, {.shuffle = true, .seed = 4});
  b.set_epoch(1);
  CHECK(b.indices() == c.indices());
  DistributedSampler other_seed(200, 2, 1, {.shuffle = true, .seed = 99});
  CHECK(other_seed.indices() != epoch0);
  // Shuffled, not the identity share.
  CHECK(epoch0 != DistributedSampler(200, 2, 1, {.shuffle = false}).indices());
}

TEST_CASE("a DataLoader over a DistributedSampler yields this rank's samples in batches") {
  std::vector<float> features(10);
  std::iota(features.begin(), features.end(), 0.f);
  std::vector<int64_t> targets(10);
  std::iota(targets.begin(), targets.end(), int64_t(0));
  auto data = std::make_shared<TensorDataset>(Tensor::from_vector(features, {10, 1}), Tensor::from_vector(targets));
  auto sampler = std::make_shared<DistributedSampler>(10, 3, 1, DistributedSamplerOptions{.shuffle = false});
  DataLoader loader(data, {.batch_size = 3, .prefetch = false}, sampler);
  std::vector<Indices> batches;
  for (const Batch& batch : loader) batches.push_back(batch.targets.to_vector<int64_t>());
  CHECK(batches == std::vector<Indices>{{1, 4, 7}, {0}});
}

TEST_CASE("DistributedSampler refuses impossible ranks, world sizes and sizes") {
  CHECK_THROWS_WITH(DistributedSampler(10, 2, 2), doctest::Contains("rank 2 is outside [0, 2)"));
  CHECK_THROWS_WITH(DistributedSampler(10, 2, -1), doctest::Contains("hint:"));
  CHECK_THROWS_WITH(DistributedSampler(10, 0, 0), doctest::Contains("num_replicas is 0"));
  CHECK_THROWS_WITH(DistributedSampler(-1, 2, 0), doctest::Contains("negative data set size"));
}
