// DistributedDataParallel across real processes: two forked ranks meet through tcp:// rendezvous (a
// TcpStore hosted by rank 0), train a model whose backward is long (three wide Linear layers), record
// a trace, and save their final weights. The parent checks that
//   - both replicas are bitwise identical, and bitwise equal to one process that computes what DDP
//     computes: each rank's half-batch forward and backward on its own (the same GEMMs, on one thread
//     as the ranks run them), the two gradients summed and divided as the all-reduce's avg does, then
//     the same Adam step. Equal to the last bit on every GEMM library and ISA: a real bug cannot hide
//     inside a tolerance;
//   - the trace (merged from both ranks, as a user opens it) shows, in every iteration, bucket 0 ready
//     and its all-reduce started on the comm lane *before* that rank's backward pass ended: the overlap
//     DDP exists for. (Ordering of recorded events, not a timing measurement.)
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tinyddp/comm/store/rendezvous.h"
#include "tinyddp/core/safetensors.h"
#include "tinyddp/core/trace.h"
#include "tinyddp/kernels/ops.h"
#include "tinyddp/nn/data/distributed_sampler.h"
#include "tinyddp/nn/ddp/distributed_data_parallel.h"
#include "tinyddp/nn/optim/adam.h"
#include "test/comm/helpers/child_process.h"
#include "test/nn/ddp/test_ddp_support.h"
#include "test/test_support.h"

using namespace tinyddp;
using namespace tinyddp::nn;
using namespace tinyddp::testing;
using json = nlohmann::json;

namespace {

const std::vector<int64_t> kWidths{256, 1024, 1024, 1024, 10};
constexpr int64_t kBatch = 64, kSteps = 3, kWorld = 2, kSamples = kBatch * kSteps * kWorld;

using tinyddp::testing::TempDir;

Tensor features() { return random_features(kSamples, kWidths.front(), 11); }
Tensor labels() { return random_labels(kSamples, kWidths.back(), 12); }

// One rank's whole job, run in a forked child.
int run_rank(int rank, int port, const TempDir& dir) {
  kernels::set_cpu_threads(1);  // two processes on two cores
  trace::start(dir.file("trace.json"), rank);
  comm::RendezvousOptions join;
  join.rank = rank;
  join.world_size = int(kWorld);
  join.timeout = std::chrono::seconds(60);
  auto meeting = comm::rendezvous("tcp://127.0.0.1:" + std::to_string(port), join);
  comm::ProcessGroupOptions options;
  options.timeout = std::chrono::seconds(60);
  auto group = comm::create_process_group("host", meeting.store, meeting.rank, meeting.world_size, options);

  auto model = make_mlp(kWidths, uint64_t(rank + 1));  // rank 1's own weights are replaced by rank 0's
  DistributedDataParallel ddp(*model, group);
  Adam optimizer(ddp.named_parameters(), 1e-3);
  const Tensor x = features(), y = labels();
  std::vector<int64_t> mine = DistributedSampler(kSamples, int(kWorld), rank, {.shuffle = false}).indices();
  for (int64_t step = 0; step < kSteps; ++step) {
    std::vector<int64_t> batch(mine.begin() + step * kBatch, mine.begin() + (step + 1) * kBatch);
    optimizer.zero_grad();
    train_step_backward(ddp, gather_rows<float>(x, batch), gather_rows<int64_t>(y, batch));
    optimizer.step();
  }
  NamedTensors weights;
  for (auto& named : model->named_parameters()) weights.emplace_back(named.name, named.parameter->value);
  save_safetensors(dir.file("rank" + std::to_string(rank) + ".safetensors"), weights);
  trace::flush();
  group->barrier()->wait();  // rank 0 hosts the store: it leaves last
  return 0;
}

// One process doing DDP's arithmetic (gradients_as_ddp_averages): at each step, each rank's
// half-batch through forward and backward on its own, the gradients summed and divided as the
// all-reduce's avg does, then Adam. Run in a child, on one GEMM thread as the ranks: a GEMM split over
// threads may sum in another order.
int run_reference(const TempDir& dir) {
  kernels::set_cpu_threads(1);
  auto model = make_mlp(kWidths, 1);  // rank 0's weights, which DDP broadcasts
  Adam optimizer(model->named_parameters(), 1e-3);
  const Tensor x = features(), y = labels();
  for (int64_t step = 0; step < kSteps; ++step) {
    const std::vector<float> averaged = gradients_as_ddp_averages(*model, int(kWorld), [&](int rank) {
      std::vector<int64_t> mine = DistributedSampler(kSamples, int(kWorld), rank, {.shuffle = false}).indices();
      std::vector<int64_t> batch(mine.begin() + step * kBatch, mine.begin() + (step + 1) * kBatch);
      train_step_backward(*model, gather_rows<float>(x, batch), gather_rows<int64_t>(y, batch));
    });
    set_flat_grads(*model, averaged);
    optimizer.step();
  }
  NamedTensors weights;
  for (auto& named : model->named_parameters()) weights.emplace_back(named.name, named.parameter->value);
  save_safetensors(dir.file("reference.safetensors"), weights);
  return 0;
}

std::vector<json> events_of(const json& trace, int rank, const std::string& name) {
  std::vector<json> out;
  for (const json& e : trace["traceEvents"])
    if (e.value("pid", -1) == rank && e.value("name", "") == name) out.push_back(e);
  return out;
}

}  // namespace

TEST_CASE(
    "two processes over tcp://: identical replicas equal to one process, and bucket 0 on the wire before backward "
    "ends") {
  TINYDDP_SKIP_UNDER_TSAN();  // the ranks are spawn_child lambdas: forked, no exec
  TempDir dir;
  const int port = free_loopback_port();
  REQUIRE(port > 0);
  std::vector<Child> children;
  for (int rank = 0; rank < kWorld; ++rank)
    children.push_back(spawn_child([&, rank](std::string&) { return run_rank(rank, port, dir); }));
  for (int rank = 0; rank < kWorld; ++rank) {
    ChildOutcome outcome = finish_child(children[size_t(rank)], std::chrono::seconds(120));
    REQUIRE_MESSAGE(outcome.ok(), "rank ", rank, ": ", outcome.describe());
  }

  // The weights: identical on both ranks, and those of the one-process reference.
  {
    Child reference = spawn_child([&](std::string&) { return run_reference(dir); });
    ChildOutcome outcome = finish_child(reference, std::chrono::seconds(120));
    REQUIRE_MESSAGE(outcome.ok(), "the one-process reference: ", outcome.describe());
  }
  SafetensorsFile rank0 = load_safetensors(dir.file("rank0.safetensors"));
  SafetensorsFile rank1 = load_safetensors(dir.file("rank1.safetensors"));
  SafetensorsFile reference = load_safetensors(dir.file("reference.safetensors"));
  for (const auto& named : make_mlp(kWidths, 1)->named_parameters()) {
    CAPTURE(named.name);
    CHECK(bitwise_equal(rank0.get(named.name), rank1.get(named.name)));
    CHECK(bitwise_equal(rank0.get(named.name), reference.get(named.name)));
  }

  // The trace, merged as rank 0 merges it for a user.
  trace::merge(dir.file("trace.json"), int(kWorld));
  std::ifstream in(dir.file("trace.json"));
  const json merged = json::parse(in);
  for (int rank = 0; rank < kWorld; ++rank) {
    CAPTURE(rank);
    std::vector<json> backwards = events_of(merged, rank, "backward");
    std::vector<json> launches = events_of(merged, rank, "all_reduce bucket 0");
    std::vector<json> ready = events_of(merged, rank, "bucket 0 ready");
    REQUIRE(backwards.size() == size_t(kSteps));
    REQUIRE(launches.size() == size_t(kSteps));
    REQUIRE(ready.size() == size_t(kSteps));
    CHECK(events_of(merged, rank, "all_reduce bucket 1").size() == size_t(kSteps));
    for (int64_t step = 0; step < kSteps; ++step) {
      const int64_t begin = backwards[size_t(step)]["ts"], end = begin + backwards[size_t(step)]["dur"].get<int64_t>();
      const int64_t launched = launches[size_t(step)]["ts"], became_ready = ready[size_t(step)]["ts"];
      CAPTURE(step);
      CHECK(launches[size_t(step)]["tid"] == int(trace::Lane::comm));
      CHECK(begin <= became_ready);
      CHECK(became_ready <= launched);
      CHECK(launched < end);  // on the wire while backward still computes the earlier layers
    }
  }
}
