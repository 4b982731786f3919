// ZeroRedundancyOptimizer (ZeRO-1): the same weights as plain DDP to the bit, 1/N of the optimizer
// state per rank, and checkpoints that move between world sizes and into a plain optimizer. The
// references are independent: plain DDP with the unsharded optimizer on the same batches, and the
// same run continued without interruption at the original world size.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tinyddp/comm/host_backend.h"
#include "tinyddp/core/error.h"
#include "tinyddp/kernels/ops.h"
#include "tinyddp/nn/ddp/distributed_data_parallel.h"
#include "tinyddp/nn/optim/adam.h"
#include "tinyddp/nn/optim/clip.h"
#include "tinyddp/nn/optim/sgd.h"
#include "tinyddp/nn/optim/zero_redundancy_optimizer.h"
#include "tinyddp/nn/train/checkpoint.h"
#include "test/nn/ddp/test_ddp_support.h"
#include "test/test_support.h"

using namespace tinyddp;
using namespace tinyddp::nn;
using namespace tinyddp::testing;

namespace {

// Odd widths: buckets whose element counts do not divide by 3 or 4, so chunks and slots differ.
const std::vector<int64_t> kWidths{13, 17, 11, 3};
constexpr int64_t kGlobalBatch = 12;  // divides by 1, 2, 3, 4
const DdpOptions kSmallBuckets{.bucket_cap_mb = 0.0004, .first_bucket_mb = 0.0001};

// DDP's all-reduce pinned to the ring: ZeRO's reduce-scatter adds in the ring's order (zero_shard.h);
// recursive doubling or the direct exchange would add in another order for small buckets.
std::vector<std::shared_ptr<comm::ProcessGroup>> ring_groups(int world) {
  comm::ProcessGroupOptions options;
  options.timeout = std::chrono::seconds(60);
  options.algorithm = "ring";
  return make_groups(world, options);
}

struct Data {
  Tensor x = random_features(kGlobalBatch * 8, kWidths.front(), 11);
  Tensor y = random_labels(kGlobalBatch * 8, kWidths.back(), 12);
  // Global batch `step`, rank's contiguous share of it.
  std::vector<int64_t> rows(int64_t step, int rank, int world) const {
    const int64_t per_rank = kGlobalBatch / world, first = (step % 8) * kGlobalBatch + rank * per_rank;
    std::vector<int64_t> out;
    for (int64_t i = 0; i < per_rank; ++i) out.push_back(first + i);
    return out;
  }
};

using MakeOptimizer = std::function<std::unique_ptr<Optimizer>(std::vector<NamedParameter>)>;

// Trains `steps` steps at `world` ranks (step 2 accumulates two micro-batches under no_sync) and
// returns rank 0's weights, checking that every rank ends with the same ones.
std::vector<float> train(int world, bool zero, const MakeOptimizer& make, int steps) {
  const Data data;
  auto groups = ring_groups(world);
  std::vector<std::vector<float>> weights(static_cast<size_t>(world));
  run_ranks(world, [&](int rank) {
    auto model = make_mlp(kWidths, 3);
    DistributedDataParallel ddp(*model, groups[size_t(rank)], kSmallBuckets);
    std::unique_ptr<Optimizer> plain = make(ddp.named_parameters());
    std::unique_ptr<ZeroRedundancyOptimizer> sharded;
    if (zero) sharded = std::make_unique<ZeroRedundancyOptimizer>(ddp, *plain);
    Optimizer& optimizer = zero ? static_cast<Optimizer&>(*sharded) : *plain;
    for (int step = 0; step < steps; ++step) {
      optimizer.zero_grad();
      const auto rows = data.rows(step, rank, world);
      if (step == 2) {
        auto guard = ddp.no_sync();
        std::vector<int64_t> extra(rows.begin(), rows.end());
        for (int64_t& r : extra) r += kGlobalBatch;
        train_step_backward(ddp, gather_rows<float>(data.x, extra), gather_rows<int64_t>(data.y, extra));
      }
      train_step_backward(ddp, gather_rows<float>(data.x, rows), gather_rows<int64_t>(data.y, rows));
      optimizer.step();
    }
    if (sharded) sharded->wait_for_parameters();
    weights[size_t(rank)] = flat_values(*model);
    // The ranks share this host: the shards' reduce-scatters and all-gathers (one of each per step at
    // least) read and write the staging buffers in symmetric memory.
    if (zero && world > 1)
      CHECK(dynamic_cast<comm::HostBackend&>(*groups[size_t(rank)]).symmetric_collectives() >= uint64_t(2 * steps));
  });
  for (int rank = 1; rank < world; ++rank) CHECK(weights[size_t(rank)] == weights[0]);
  return weights[0];
}

}  // namespace

TEST_CASE("ZeRO-1 ends with plain DDP's weights to the bit (ring all-reduce), at 1 to 4 ranks, with no_sync") {
  MakeOptimizer adam = [](std::vector<NamedParameter> p) { return std::make_unique<Adam>(std::move(p), 0.01); };
  MakeOptimizer adamw = [](std::vector<NamedParameter> p) {
    return std::make_unique<AdamW>(std::move(p), 0.01, std::make_pair(0.9, 0.99), 1e-8, 0.1);
  };
  MakeOptimizer sgd = [](std::vector<NamedParameter> p) {
    return std::make_unique<SGD>(std::move(p), 0.05, 0.9, 0, 1e-3, true);
  };
  const std::vector<float> start = flat_values(*make_mlp(kWidths, 3));
  for (int world : {1, 2, 3, 4}) {
    CAPTURE(world);
    const std::vector<float> ddp = train(world, false, adam, 5);
    CHECK(ddp != start);
    CHECK(train(world, true, adam, 5) == ddp);
  }
  CHECK(train(3, true, adamw, 4) == train(3, false, adamw, 4));
  CHECK(train(3, true, sgd, 4) == train(3, false, sgd, 4));
}

namespace {

// Parameters whose gradients become ready in registration order (not the reverse that DDP plans
// for), so DDP's rebuild after the first iteration lays the buckets out anew. Every element's
// gradient differs (by element, parameter, call and rank), so state moved to a wrong place would show.
class ForwardOrderModule : public Module {
 public:
  ForwardOrderModule(const std::vector<int64_t>& sizes, int rank) : rank_(rank) {
    for (size_t i = 0; i < sizes.size(); ++i)
      parameters_.push_back(&register_parameter("p" + std::to_string(i), Tensor::zeros({sizes[i]})));
  }
  Tensor forward(const Tensor& input) override { return input; }
  Tensor backward(const Tensor& grad_output, bool) override {
    for (size_t k = 0; k < parameters_.size(); ++k) {
      Parameter& p = *parameters_[k];
      const float beta = p.begin_grad_write();
      float* g = p.grad.data<float>();
      for (int64_t i = 0; i < p.grad.numel(); ++i)
        g[i] = (beta == 0.f ? 0.f : g[i]) +
               std::sin(0.37f * float(i) + 1.3f * float(k) + 0.71f * float(calls_) + float(rank_));
      p.mark_grad_ready();
    }
    ++calls_;
    return grad_output;
  }
  std::string describe() const override { return "ForwardOrderModule"; }

 private:
  int rank_, calls_ = 0;
  std::vector<Parameter*> parameters_;
};

// `steps` steps of a ForwardOrderModule under `ddp`: with ZeRO-1 over `plain`'s settings, or with
// `plain` itself. Returns the ZeroRedundancyOptimizer (null without), its all-gathers finished.
std::unique_ptr<ZeroRedundancyOptimizer> step_forward_order(DistributedDataParallel& ddp, Optimizer& plain, bool zero,
                                                            int steps) {
  std::unique_ptr<ZeroRedundancyOptimizer> sharded;
  if (zero) sharded = std::make_unique<ZeroRedundancyOptimizer>(ddp, plain);
  Optimizer& optimizer = zero ? static_cast<Optimizer&>(*sharded) : plain;
  for (int step = 0; step < steps; ++step) {
    optimizer.zero_grad();
    ddp.forward(Tensor::zeros({1}));
    ddp.backward(Tensor::zeros({1}));
    optimizer.step();
  }
  if (sharded) sharded->wait_for_parameters();
  return sharded;
}

}  // namespace

TEST_CASE("ZeRO-1's shards and their state follow DDP's bucket rebuild, still bitwise equal to DDP") {
  constexpr int kWorld = 3;
  auto groups = ring_groups(kWorld);
  std::vector<std::vector<float>> zero_weights(kWorld), ddp_weights(kWorld);
  std::vector<char> rebuilt(kWorld);  // not bool: the rank threads' flags would share a word and race
  run_ranks(kWorld, [&](int rank) {
    for (bool zero : {true, false}) {
      ForwardOrderModule model({7, 5, 9, 4}, rank);
      DistributedDataParallel ddp(model, groups[size_t(rank)], {.bucket_cap_mb = 0.00004, .first_bucket_mb = 0.00002});
      const std::vector<BucketSpec> planned = ddp.reducer().buckets();
      Adam adam(ddp.named_parameters(), 0.05);
      auto sharded = step_forward_order(ddp, adam, zero, 4);
      (zero ? zero_weights : ddp_weights)[size_t(rank)] = flat_values(model);
      if (zero) rebuilt[size_t(rank)] = ddp.reducer().buckets()[0].parameters != planned[0].parameters;
    }
  });
  for (int rank = 0; rank < kWorld; ++rank) {
    CHECK(rebuilt[size_t(rank)]);
    CHECK(zero_weights[size_t(rank)] == ddp_weights[size_t(rank)]);
    CHECK(zero_weights[size_t(rank)] == zero_weights[0]);
  }
  CHECK(ddp_weights[0] != std::vector<float>(25, 0.f));
}

TEST_CASE("ZeRO-1 with buckets smaller than the world: ranks that own nothing of a bucket still take part") {
  constexpr int kWorld = 4;
  auto groups = ring_groups(kWorld);
  std::vector<std::vector<float>> zero_weights(kWorld), ddp_weights(kWorld);
  run_ranks(kWorld, [&](int rank) {
    for (bool zero : {true, false}) {
      ForwardOrderModule model({1, 2, 3}, rank);  // one bucket each: 1, 2 and 3 elements for 4 ranks
      DistributedDataParallel ddp(model, groups[size_t(rank)],
                                  {.bucket_cap_mb = 0.000001, .first_bucket_mb = 0.000001});
      SGD sgd(ddp.named_parameters(), 0.1, 0.9);
      auto sharded = step_forward_order(ddp, sgd, zero, 3);
      if (sharded) CHECK(sharded->owned_elements() <= 3);
      (zero ? zero_weights : ddp_weights)[size_t(rank)] = flat_values(model);
    }
  });
  for (int rank = 0; rank < kWorld; ++rank) CHECK(zero_weights[size_t(rank)] == ddp_weights[0]);
  CHECK(ddp_weights[0] != std::vector<float>(6, 0.f));
}

TEST_CASE("ZeRO-1 keeps 1/N of Adam's state on each rank") {
  size_t unsharded = 0;
  {
    auto model = make_mlp(kWidths, 3);
    Adam adam(model->named_parameters(), 0.01);
    for (auto& [name, tensor] : adam.state_tensors()) unsharded += tensor.nbytes();
  }
  REQUIRE(unsharded > 0);
  const Data data;
  for (int world : {1, 2, 4}) {
    auto groups = ring_groups(world);
    std::vector<size_t> bytes(static_cast<size_t>(world));
    size_t buckets = 0;
    run_ranks(world, [&](int rank) {
      auto model = make_mlp(kWidths, 3);
      DistributedDataParallel ddp(*model, groups[size_t(rank)], kSmallBuckets);
      Adam settings(ddp.named_parameters(), 0.01);
      ZeroRedundancyOptimizer zero(ddp, settings);
      for (int step = 0; step < 2; ++step) {  // past the rebuild of the buckets
        zero.zero_grad();
        const auto rows = data.rows(step, rank, world);
        train_step_backward(ddp, gather_rows<float>(data.x, rows), gather_rows<int64_t>(data.y, rows));
        zero.step();
      }
      bytes[size_t(rank)] = zero.state_bytes();
      if (rank == 0) buckets = ddp.reducer().buckets().size();
    });
    size_t total = 0;
    for (size_t b : bytes) {
      total += b;
      // Each bucket's chunks differ by at most one element: 2 states x 4 bytes per bucket.
      CHECK(double(b) <= double(unsharded) / world + 8.0 * double(buckets));
      CHECK(double(b) >= double(unsharded) / world - 8.0 * double(buckets));
    }
    CHECK(total == unsharded);  // nothing stored twice, nothing missing
    MESSAGE("Adam state per rank at N = " << world << ": " << bytes[0] << " bytes (unsharded " << unsharded << ", "
                                          << buckets << " buckets)");
  }
}

TEST_CASE("a ZeRO checkpoint saved at 4 ranks resumes at 4 and 2 (ZeRO) and at 1 (plain Adam) where it stopped") {
  constexpr int kSaved = 3, kTotal = 6;
  // One GEMM thread in every rank and in the one-process reference, so that every comparison below can
  // be bitwise: no library splits a product's sums differently between them.
  kernels::set_cpu_threads(1);
  const Data data;
  TempDir dir("tinyddp_zero");
  const std::string path = (dir.path / "zero.safetensors").string();
  struct Run {
    std::vector<double> losses;  // per step, averaged over the ranks
    std::vector<float> weights;  // rank 0's, at the end
  };
  // Losses are averaged over the ranks: each rank holds an equal share of the global batch.
  auto run = [&](int world, int first_step, bool resume) {
    auto groups = ring_groups(world);
    std::vector<std::vector<double>> rank_losses(size_t(world), std::vector<double>(kTotal, 0.0));
    Run out;
    run_ranks(world, [&](int rank) {
      auto model = make_mlp(kWidths, 3);
      DistributedDataParallel ddp(*model, groups[size_t(rank)], kSmallBuckets);
      Adam settings(ddp.named_parameters(), 0.01);
      ZeroRedundancyOptimizer zero(ddp, settings);
      if (resume) load_checkpoint(path, *model, &zero, nullptr);
      for (int step = first_step; step < kTotal; ++step) {
        zero.zero_grad();
        const auto rows = data.rows(step, rank, world);
        rank_losses[size_t(rank)][size_t(step)] = train_step_backward(ddp, gather_rows<float>(data.x, rows),
                                                                      gather_rows<int64_t>(data.y, rows));
        zero.step();
        if (!resume && step + 1 == kSaved) {
          zero.consolidate_state_dict();  // every rank
          if (rank == 0) save_checkpoint(path, *model, &zero, nullptr);
          groups[size_t(rank)]->barrier()->wait();
        }
      }
      zero.wait_for_parameters();
      if (rank == 0) out.weights = flat_values(*model);
    });
    out.losses.assign(kTotal, 0.0);
    for (const auto& mine : rank_losses)
      for (int s = 0; s < kTotal; ++s) out.losses[size_t(s)] += mine[size_t(s)] / world;
    return out;
  };
  const Run at4 = run(4, 0, false);
  // At the world size it was saved at, the run continues as if never stopped: the same weights, the
  // same moments and step count, the same bucket sums, so the same bits.
  const Run again4 = run(4, kSaved, true);
  // At 2 ranks (ZeRO) and in one process (a plain Adam loading the unsharded names), against each
  // other: the one process runs the two ranks' half-batches separately and averages their gradients
  // as the all-reduce does, so it computes what 2 ranks compute, bit for bit. (Against the 4-rank run
  // they agree to rounding only: other batch splits add the rows' gradients in another order.)
  const Run at2 = run(2, kSaved, true);
  Run at1{std::vector<double>(kTotal, 0.0), {}};
  {
    auto model = make_mlp(kWidths, 3);
    Adam adam(model->named_parameters(), 0.01);
    load_checkpoint(path, *model, &adam, nullptr);
    CHECK(adam.step_count() == kSaved);
    for (int step = kSaved; step < kTotal; ++step) {
      std::vector<float> averaged = gradients_as_ddp_averages(*model, 2, [&](int rank) {
        const auto rows = data.rows(step, rank, 2);
        const float loss = train_step_backward(*model, gather_rows<float>(data.x, rows),
                                               gather_rows<int64_t>(data.y, rows));
        at1.losses[size_t(step)] += double(loss) / 2;
      });
      adam.zero_grad();
      set_flat_grads(*model, averaged);
      adam.step();
    }
    at1.weights = flat_values(*model);
  }
  for (int step = kSaved; step < kTotal; ++step) {
    CAPTURE(step);
    CHECK(again4.losses[size_t(step)] == at4.losses[size_t(step)]);
    CHECK(at1.losses[size_t(step)] == at2.losses[size_t(step)]);
  }
  check_identical(again4.weights, at4.weights, "resumed at 4 vs never stopped");
  check_identical(at1.weights, at2.weights, "plain Adam in one process vs ZeRO at 2");
  // A fresh Adam's first resumed step would differ: the moments and step count did carry over.
  {
    auto model = make_mlp(kWidths, 3);
    load_model(path, *model);
    Adam fresh(model->named_parameters(), 0.01);
    for (int step = kSaved; step < kTotal; ++step) {
      fresh.zero_grad();
      const auto rows = data.rows(step, 0, 1);
      const float loss = train_step_backward(*model, gather_rows<float>(data.x, rows),
                                             gather_rows<int64_t>(data.y, rows));
      fresh.step();
      if (step == kTotal - 1) CHECK(double(loss) != doctest::Approx(at4.losses[size_t(step)]).epsilon(1e-5));
    }
  }
}

TEST_CASE("ZeRO-1's misuse is refused with a reason") {
  auto groups = ring_groups(1);
  auto model = make_mlp(kWidths, 3);
  DistributedDataParallel ddp(*model, groups[0], kSmallBuckets);
  Adam settings(ddp.named_parameters(), 0.01);
  ZeroRedundancyOptimizer zero(ddp, settings);
  CHECK_THROWS_WITH_AS(zero.step(), doctest::Contains("no synchronised backward"), Error);
  CHECK_THROWS_WITH_AS(ZeroRedundancyOptimizer(ddp, settings), doctest::Contains("already registered"), Error);
  const Data data;
  const auto rows = data.rows(0, 0, 1);
  train_step_backward(ddp, gather_rows<float>(data.x, rows), gather_rows<int64_t>(data.y, rows));
  zero.step();
  CHECK_THROWS_WITH_AS(zero.state_tensors(), doctest::Contains("consolidate_state_dict()"), Error);
}

TEST_CASE("ZeRO-1 clips by the global norm over the shards as plain DDP clips the averaged gradients") {
  constexpr int kWorld = 3, kSteps = 4;
  constexpr double kMaxNorm = 0.05;  // well below the gradients' norm: every step is clipped
  const Data data;
  std::vector<std::vector<double>> norms(2, std::vector<double>(kWorld * kSteps));
  std::vector<std::vector<float>> weights(2);
  for (bool zero : {false, true}) {
    auto groups = ring_groups(kWorld);
    run_ranks(kWorld, [&](int rank) {
      auto model = make_mlp(kWidths, 3);
      DistributedDataParallel ddp(*model, groups[size_t(rank)], kSmallBuckets);
      Adam plain(ddp.named_parameters(), 0.01);
      std::unique_ptr<ZeroRedundancyOptimizer> sharded;
      if (zero) sharded = std::make_unique<ZeroRedundancyOptimizer>(ddp, plain);
      for (int step = 0; step < kSteps; ++step) {
        (zero ? static_cast<Optimizer&>(*sharded) : plain).zero_grad();
        const auto rows = data.rows(step, rank, kWorld);
        train_step_backward(ddp, gather_rows<float>(data.x, rows), gather_rows<int64_t>(data.y, rows));
        double& norm = norms[zero][size_t(step * kWorld + rank)];
        if (zero) {
          CHECK(sharded->gradients_finite());
          norm = sharded->clip_grad_norm(kMaxNorm);
          sharded->step();
        } else {
          norm = clip_grad_norm(model->parameters(), kMaxNorm);
          plain.step();
        }
      }
      if (sharded) sharded->wait_for_parameters();
      if (rank == 0) weights[zero] = flat_values(*model);
    });
  }
  // Both norms add the same n squares (the same averaged gradients; each square exact in double) in
  // other orders: plain DDP parameter by parameter, ZeRO shard by shard and then across the ranks. Any
  // order of a sum of n positive doubles is within (n - 1) 2^-53 of the exact sum, relatively, so the
  // two sums are within 2(n - 1) 2^-53 of each other and their square roots (each rounded once) within
  // n 2^-53 + 2^-53 < 2n 2^-53.
  const double n = double(flat_values(*make_mlp(kWidths, 3)).size());
  bool same_factors = true;
  for (size_t i = 0; i < norms[0].size(); ++i) {
    CHECK(norms[0][i] > kMaxNorm * 2);
    CHECK(norms[1][i] == doctest::Approx(norms[0][i]).epsilon(2 * n * 0x1p-53));
    CHECK(norms[1][i] == norms[1][i - i % kWorld]);  // every rank: the same norm
    // The factor each run scaled its gradients by (clip.cpp's formula, rounded to float).
    same_factors &= float(kMaxNorm / (norms[0][i] + 1e-6)) == float(kMaxNorm / (norms[1][i] + 1e-6));
  }
  // The same gradients scaled by the same float factor, then the same Adam step: the same bits. The
  // factors differ only where one lies within about 1e-13 of a rounding boundary between floats (odds
  // of about 1e-6 a step); nothing then bounds the difference through Adam's normalisation, and the
  // test says so instead of passing on a tolerance.
  if (same_factors)
    check_identical(weights[1], weights[0], "ZeRO-1 clipped vs plain DDP clipped");
  else
    MESSAGE("the two runs' clip factors rounded to different floats: their weights are not compared");
}

TEST_CASE("ZeRO-1's gradients_finite: a NaN in one rank's shard is every rank's verdict") {
  constexpr int kWorld = 3;
  auto groups = ring_groups(kWorld);
  const Data data;
  std::vector<int> verdicts(kWorld, -1);
  run_ranks(kWorld, [&](int rank) {
    auto model = make_mlp(kWidths, 3);
    DistributedDataParallel ddp(*model, groups[size_t(rank)], kSmallBuckets);
    Adam plain(ddp.named_parameters(), 0.01);
    ZeroRedundancyOptimizer zero(ddp, plain);
    const auto rows = data.rows(0, rank, kWorld);
    train_step_backward(ddp, gather_rows<float>(data.x, rows), gather_rows<int64_t>(data.y, rows));
    CHECK(zero.gradients_finite());
    if (rank == 1) zero.local_optimizer().params()[0].parameter->grad.data<float>()[0] = NAN;  // its shard only
    verdicts[size_t(rank)] = zero.gradients_finite();
  });
  CHECK(verdicts == std::vector<int>(kWorld, 0));
}
