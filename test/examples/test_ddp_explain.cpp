// examples/ddp_explain/textbook_ddp.h, DDP as a textbook writes it (one flat bucket, all-reduced when
// the last gradient is ready), trains exactly as the real DistributedDataParallel does: the same
// model, data and steps give the Reducer's averaged gradients and final weights to the last bit, at
// 2 and 3 ranks (threads, one "host" process group each over one in-process store).
//
// Bit for bit needs the same additions in the same order. The Reducer all-reduces several buckets
// and the textbook one, so an element sits at a different place of a different buffer in the two.
// The groups here therefore run the direct exchange (ProcessGroupOptions::algorithm = "direct"),
// which adds every element as rank 0's value, then rank 1's, ..., wherever the element sits; the
// ring would not do (its order depends on the chunk the element falls in, so on where the buffer
// starts: the last test shows the difference). The sum is then divided by the world size, element
// by element, in both.
#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <vector>

#include "tinyddp/nn/ddp/distributed_data_parallel.h"
#include "tinyddp/nn/loss.h"
#include "tinyddp/nn/optim/adam.h"
#include "test/examples/example_programs.h"
#include "test/nn/ddp/test_ddp_support.h"
#include "test/test_support.h"
#include "examples/ddp_explain/textbook_ddp.h"

using namespace tinyddp;
using namespace tinyddp::testing;

namespace {

const std::vector<int64_t> kWidths{12, 16, 16, 3};
constexpr int64_t kBatch = 4, kSteps = 4, kSamples = 3 * kBatch * kSteps;
// Small caps, so the Reducer splits the 531 gradients of kWidths' MLP into several buckets.
const nn::DdpOptions kSeveralBuckets{.bucket_cap_mb = 0.0005, .first_bucket_mb = 0.0001};

std::vector<std::shared_ptr<comm::ProcessGroup>> groups_with(int world, const std::string& algorithm) {
  comm::ProcessGroupOptions options;
  options.timeout = std::chrono::seconds(60);
  options.algorithm = algorithm;
  return make_groups(world, options);
}

// Rank r's rows at `step`: rows r, r+W, r+2W, ... (a DistributedSampler without shuffling), kBatch a step.
std::vector<int64_t> rows(int rank, int world, int64_t step) {
  std::vector<int64_t> out;
  for (int64_t k = 0; k < kBatch; ++k) out.push_back((step * kBatch + k) * world + rank);
  return out;
}

struct Training {
  std::vector<std::vector<float>> first_gradients;  // per rank: param.grad after the first step's wait
  std::vector<std::vector<float>> final_weights;    // per rank, after kSteps Adam steps
  size_t reducer_buckets = 0;
};

enum class Wrapper { textbook, reducer };

// kSteps of Adam on every rank. Each rank builds its model from its own seed: the wrapper must hand
// out rank 0's weights.
Training train(Wrapper wrapper, int world, const std::string& algorithm) {
  const Tensor x = random_features(kSamples, kWidths.front(), 11);
  const Tensor y = random_labels(kSamples, kWidths.back(), 12);
  auto groups = groups_with(world, algorithm);
  Training out;
  out.first_gradients.resize(size_t(world));
  out.final_weights.resize(size_t(world));
  run_ranks(world, [&](int rank) {
    auto model = make_mlp(kWidths, rank == 0 ? 7 : 100 + uint64_t(rank));
    nn::Adam optimizer(model->named_parameters(), 0.01);
    nn::CrossEntropyLoss criterion;
    auto steps = [&](auto&& one_step) {
      for (int64_t step = 0; step < kSteps; ++step) {
        const std::vector<int64_t> mine = rows(rank, world, step);
        optimizer.zero_grad();
        one_step(gather_rows<float>(x, mine), gather_rows<int64_t>(y, mine));
        if (step == 0) out.first_gradients[size_t(rank)] = flat_grads(*model);
        optimizer.step();
      }
    };
    if (wrapper == Wrapper::textbook) {
      examples::TextbookDdp ddp(*model, groups[size_t(rank)]);
      steps([&](const Tensor& inputs, const Tensor& labels) {
        criterion.forward(ddp.forward(inputs), labels);
        ddp.backward(criterion.backward());
        ddp.wait_for_gradients();
      });
    } else {
      nn::DistributedDataParallel ddp(*model, groups[size_t(rank)], kSeveralBuckets);
      if (rank == 0) out.reducer_buckets = ddp.reducer().buckets().size();
      steps([&](const Tensor& inputs, const Tensor& labels) { train_step_backward(ddp, inputs, labels); });
    }
    out.final_weights[size_t(rank)] = flat_values(*model);
  });
  return out;
}

// The first step's average computed here, without any process group: every rank's local gradient
// from a plain copy of rank 0's model, added in rank order and divided by the world size -- the
// direct exchange's arithmetic, done by a plain loop.
std::vector<float> averaged_by_hand(int world) {
  const Tensor x = random_features(kSamples, kWidths.front(), 11);
  const Tensor y = random_labels(kSamples, kWidths.back(), 12);
  std::vector<float> sum;
  for (int rank = 0; rank < world; ++rank) {
    auto model = make_mlp(kWidths, 7);
    const std::vector<int64_t> mine = rows(rank, world, 0);
    train_step_backward(*model, gather_rows<float>(x, mine), gather_rows<int64_t>(y, mine));
    const std::vector<float> local = flat_grads(*model);
    if (rank == 0)
      sum = local;
    else
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += local[i];
  }
  for (float& g : sum) g /= float(world);
  return sum;
}

}  // namespace

TEST_CASE("ddp_explain: the textbook DDP trains bit for bit as DistributedDataParallel does, at 2 and 3 ranks") {
  for (int world : {2, 3}) {
    CAPTURE(world);
    const Training textbook = train(Wrapper::textbook, world, "direct");
    const Training reducer = train(Wrapper::reducer, world, "direct");
    REQUIRE(reducer.reducer_buckets > 1);  // several buckets against the textbook's one
    const std::vector<float> by_hand = averaged_by_hand(world);
    const std::vector<float> initial = flat_values(*make_mlp(kWidths, 7));
    for (int r = 0; r < world; ++r) {
      CAPTURE(r);
      CHECK(textbook.first_gradients[size_t(r)] == by_hand);
      CHECK(reducer.first_gradients[size_t(r)] == by_hand);
      CHECK(textbook.final_weights[size_t(r)] == reducer.final_weights[size_t(r)]);
      CHECK(textbook.final_weights[size_t(r)] == textbook.final_weights[0]);  // the replicas agree
    }
    CHECK(textbook.final_weights[0] != initial);  // it did train
  }
}

TEST_CASE("ddp_explain: at 2 ranks any all-reduce matches, since a + b = b + a") {
  const Training textbook = train(Wrapper::textbook, 2, "ring");
  const Training reducer = train(Wrapper::reducer, 2, "ring");
  for (int r = 0; r < 2; ++r) CHECK(textbook.final_weights[size_t(r)] == reducer.final_weights[size_t(r)]);
}

TEST_CASE("ddp_explain: with the ring at 3 ranks the bucket boundaries change the sums (the check above can fail)") {
  // The ring finishes each chunk of a buffer by adding the ranks from a different one first, and an
  // element falls in different chunks of the textbook's bucket and of the Reducer's: some averaged
  // gradients differ in their last bits, though every one is the same average up to rounding.
  const Training textbook = train(Wrapper::textbook, 3, "ring");
  const Training reducer = train(Wrapper::reducer, 3, "ring");
  const std::vector<float>& a = textbook.first_gradients[0];
  const std::vector<float>& b = reducer.first_gradients[0];
  REQUIRE(a.size() == b.size());
  size_t differ = 0;
  for (size_t i = 0; i < a.size(); ++i) differ += a[i] != b[i] ? 1 : 0;
  CHECK(differ > 0);
  check_close(a, averaged_by_hand(3), 1e-7, 1e-5, "ring average vs the average by hand");
}

TEST_CASE("ddp_explain: the program shows the textbook DDP and agrees with DistributedDataParallel") {
  if (!have_programs({"ddp_explain"})) return;
  for (const char* ranks : {"2", "3"}) {
    ChildOutcome outcome = run({"ddp_explain", "--ranks", ranks});
    CHECK(outcome.exit_code == 0);
    CHECK(count(outcome.report, "DIFFERENT") == 0);
    CHECK(count(outcome.report, "the same weights to the last bit") == 1);
  }
}
