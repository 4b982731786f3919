// ddp_explain: DistributedDataParallel as a textbook writes it (textbook_ddp.h), one step at a time, on
// a few CPU ranks (threads).
//
//   build/bin/ddp_explain                      # 2 ranks, 3 steps
//   build/bin/ddp_explain --ranks 3 --steps 2
//
// Each rank is a thread with its own "host" process group (over one in-process store), its own replica
// of a small MLP built from its own seed (the textbook's broadcast replaces it with rank 0's) and its
// own rows of a small random data set. Before the textbook adds its hook to every parameter, this
// program adds one of its own; hooks run in the order they were added, so this one sees each gradient
// the moment backward finishes it, just before the textbook's, and keeps a copy of the bucket when the
// last one arrives, just before the textbook's hook starts the all-reduce. What is printed afterwards,
// step by step and rank by rank, is what the real hooks and buffers held. Then it checks:
//   - after the textbook's construction, every rank holds rank 0's weights;
//   - after the wait, every rank's bucket is (g_0 + g_1 + ... + g_(n-1)) / n of the ranks' local
//     gradients, added here in that order;
//   - after the optimizer step, every rank holds the same weights;
//   - the same steps through nn::DistributedDataParallel (the Reducer, here one bucket per parameter)
//     end with the same weights, to the last bit.
// The groups all-reduce with the direct exchange, which adds rank 0's value, then rank 1's, ..., for
// every element wherever it sits in a bucket; so the textbook's one bucket and the Reducer's several
// add the same numbers in the same order. (The ring's order depends on the chunk an element falls in,
// so on where each bucket starts: at 3 ranks or more it gives the same averages up to rounding only;
// test/examples/test_ddp_explain.cpp shows both.)
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tinyddp/comm/process_group.h"
#include "tinyddp/comm/store/hash_store.h"
#include "tinyddp/core/command_line.h"
#include "tinyddp/core/random.h"
#include "tinyddp/nn/activations.h"
#include "tinyddp/nn/ddp/distributed_data_parallel.h"
#include "tinyddp/nn/linear.h"
#include "tinyddp/nn/loss.h"
#include "tinyddp/nn/optim/adam.h"
#include "tinyddp/nn/sequential.h"
#include "textbook_ddp.h"

using namespace tinyddp;

namespace {

constexpr int64_t kFeatures = 4, kHidden = 5, kClasses = 3, kBatch = 4;  // rows per rank and step
constexpr double kLearningRate = 0.05;
constexpr size_t kShown = 6;  // bucket elements printed

// Linear(4, 5), ReLU, Linear(5, 3): parameters 0.weight, 0.bias, 2.weight, 2.bias.
std::unique_ptr<nn::Sequential> make_model(uint64_t seed) {
  Generator gen(seed);
  auto model = std::make_unique<nn::Sequential>();
  model->emplace<nn::Linear>(kFeatures, kHidden, gen);
  model->emplace<nn::ReLU>();
  model->emplace<nn::Linear>(kHidden, kClasses, gen);
  return model;
}

// The data set, and rank r's rows at `step`: r, r+n, r+2n, ... (a DistributedSampler without shuffling).
struct Data {
  std::vector<float> x;
  std::vector<int64_t> y;
};
Data make_data(int64_t rows) {
  Generator gen(2024);
  Tensor x = Tensor::empty({rows, kFeatures});
  fill_uniform(x, -1.f, 1.f, gen);
  Data data{x.to_vector<float>(), {}};
  for (int64_t i = 0; i < rows; ++i) data.y.push_back(int64_t(gen.next_below(kClasses)));
  return data;
}
std::pair<Tensor, Tensor> batch(const Data& data, int rank, int ranks, int64_t step) {
  std::vector<float> x;
  std::vector<int64_t> y;
  for (int64_t k = 0; k < kBatch; ++k) {
    const int64_t row = (step * kBatch + k) * ranks + rank;
    x.insert(x.end(), data.x.begin() + row * kFeatures, data.x.begin() + (row + 1) * kFeatures);
    y.push_back(data.y[size_t(row)]);
  }
  return {Tensor::from_vector(x, {kBatch, kFeatures}), Tensor::from_vector(y)};
}

std::vector<float> flat_weights(nn::Module& model) {
  std::vector<float> out;
  for (nn::Parameter* p : model.parameters()) {
    std::vector<float> v = p->value.to_vector<float>();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

// The bucket's last kShown elements (the gradients of the last layer, the first ones backward finishes).
std::string show(const std::vector<float>& values) {
  const size_t first = values.size() > kShown ? values.size() - kShown : 0;
  std::string text = "bucket[" + std::to_string(first) + ", " + std::to_string(values.size()) + ") =";
  char number[32];
  for (size_t i = first; i < values.size(); ++i) {
    std::snprintf(number, sizeof number, " %+.6f", double(values[i]));
    text += number;
  }
  return text;
}

// What one rank saw in one step.
struct StepLog {
  float loss = 0;
  std::vector<std::string> ready;  // parameter names, in the order backward finished them
  std::vector<float> local;        // the bucket when the last gradient was ready: this rank's own gradients
  std::vector<float> averaged;     // the bucket after the wait
  std::vector<float> weights;      // after the optimizer step
};

// Runs body(rank, group) on `ranks` threads, each with its own process group over one store.
// Returns false (having said why) when a rank failed.
template <typename Body>
bool run_ranks(int ranks, const Body& body) {
  auto store = std::make_shared<comm::HashStore>();
  store->set_timeout(std::chrono::seconds(20));
  comm::ProcessGroupOptions options;
  options.algorithm = "direct";  // see the top of this file
  options.timeout = std::chrono::seconds(20);
  options.token = "";
  std::vector<std::string> errors(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        body(r, comm::create_process_group("host", store, r, ranks, options));
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  bool ok = true;
  for (int r = 0; r < ranks; ++r)
    if (!errors[size_t(r)].empty()) {
      std::fprintf(stderr, "ddp_explain: rank %d failed: %s\n", r, errors[size_t(r)].c_str());
      ok = false;
    }
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ddp_explain: a textbook DistributedDataParallel, step by step, on CPU threads", "ddp_explain"};
  int ranks = 2;
  int64_t steps = 3;
  app.add_option("--ranks", ranks, "ranks (threads)")->check(command_line::between(2, 6))->capture_default_str();
  app.add_option("--steps", steps, "training steps")
      ->check(command_line::between<int64_t>(1, 10))
      ->capture_default_str();
  if (auto code = command_line::parse(app, argc, argv)) return *code;
  const int n = ranks;
  const Data data = make_data(steps * kBatch * n);

  // ---- the textbook DDP ----
  std::vector<std::vector<StepLog>> logs(static_cast<size_t>(n), std::vector<StepLog>(static_cast<size_t>(steps)));
  std::vector<std::vector<float>> own_start(static_cast<size_t>(n)), start(static_cast<size_t>(n));
  bool ok = run_ranks(n, [&](int rank, std::shared_ptr<comm::ProcessGroup> group) {
    auto model = make_model(uint64_t(1000 + rank));  // each rank its own seed: the broadcast must fix that
    const std::vector<nn::NamedParameter> named = model->named_parameters();
    int64_t step = 0;
    size_t ready = 0;
    const Tensor* bucket = nullptr;
    for (const nn::NamedParameter& p : named)  // this program's hook, ahead of the textbook's
      p.parameter->grad_ready_hooks.push_back([&, name = p.name](nn::Parameter&) {
        StepLog& log = logs[size_t(rank)][size_t(step)];
        log.ready.push_back(name);
        if (++ready == named.size()) log.local = bucket->to_vector<float>();  // not yet on the wire
      });
    own_start[size_t(rank)] = flat_weights(*model);
    examples::TextbookDdp ddp(*model, std::move(group));
    start[size_t(rank)] = flat_weights(*model);
    bucket = &ddp.bucket();
    nn::Adam optimizer(named, kLearningRate);
    nn::CrossEntropyLoss criterion;
    for (step = 0; step < steps; ++step) {
      StepLog& log = logs[size_t(rank)][size_t(step)];
      auto [x, y] = batch(data, rank, n, step);
      optimizer.zero_grad();
      ready = 0;
      log.loss = criterion.forward(ddp.forward(x), y);
      ddp.backward(criterion.backward());  // the hooks fire in here; the last one starts the all-reduce
      ddp.wait_for_gradients();
      log.averaged = ddp.bucket().to_vector<float>();
      optimizer.step();
      log.weights = flat_weights(*model);
    }
  });
  if (!ok) return command_line::kFailed;

  const size_t total = logs[0][0].local.size();
  const std::unique_ptr<nn::Sequential> shown = make_model(0);  // for its description and parameter names
  std::printf("%d ranks (threads), each with its own ProcessGroup(\"host\") and its own replica of\n%s\n", n,
              shown->describe().c_str());
  std::printf(
      "The textbook DDP (textbook_ddp.h) copied rank 0's weights to every rank, made every param.grad a "
      "view into\none flat bucket of %zu floats, and added a hook to every parameter:\n ",
      total);
  int64_t offset = 0;
  for (const nn::NamedParameter& p : shown->named_parameters()) {
    const int64_t size = p.parameter->value.numel();
    std::printf("%s %s = bucket[%lld, %lld)", offset == 0 ? "" : ",", p.name.c_str(), (long long)offset,
                (long long)(offset + size));
    offset += size;
  }
  std::printf("\n");
  bool all_averaged = true, all_same = true;
  for (int r = 1; r < n; ++r) {
    size_t differ = 0, still = 0;
    for (size_t i = 0; i < total; ++i) {
      differ += own_start[size_t(r)][i] != own_start[0][i] ? 1 : 0;
      still += start[size_t(r)][i] != start[0][i] ? 1 : 0;
    }
    std::printf(
        "Rank %d built its replica from its own seed: %zu of %zu weights differed from rank 0's; after the "
        "broadcast: %zu.\n",
        r, differ, total, still);
    all_same = all_same && still == 0;
  }
  std::printf("Rank r trains on rows r, r+%d, r+%d, ... of a %lld-row data set, %lld rows a step; Adam, lr %g.\n", n,
              2 * n, (long long)(steps * kBatch * n), (long long)kBatch, kLearningRate);

  for (int64_t s = 0; s < steps; ++s) {
    std::printf("\nstep %lld\n", (long long)(s + 1));
    std::vector<float> by_hand(total, 0.f);
    for (int r = 0; r < n; ++r) {
      const StepLog& log = logs[size_t(r)][size_t(s)];
      std::string order;
      for (const std::string& name : log.ready) order += (order.empty() ? "" : ", ") + name;
      std::printf("  rank %d: loss %.4f; backward finishes %s -- the last one starts all_reduce(bucket, avg)\n", r,
                  double(log.loss), order.c_str());
      std::printf("          its own gradients g_%d: %s\n", r, show(log.local).c_str());
      for (size_t i = 0; i < total; ++i) by_hand[i] = r == 0 ? log.local[i] : by_hand[i] + log.local[i];
    }
    for (float& g : by_hand) g /= float(n);
    bool averaged = true, same = true;
    for (int r = 0; r < n; ++r) {
      averaged = averaged && logs[size_t(r)][size_t(s)].averaged == by_hand;
      same = same && logs[size_t(r)][size_t(s)].weights == logs[0][size_t(s)].weights;
    }
    std::printf("  after the wait, every rank's %s\n", show(logs[0][size_t(s)].averaged).c_str());
    std::string sum = "g_0";
    for (int r = 1; r < n; ++r) sum += " + g_" + std::to_string(r);
    std::printf("  = (%s) / %d of the ranks' own gradients g_r, added here: %s\n", sum.c_str(), n,
                averaged ? "yes, every element on every rank" : "DIFFERENT");
    std::printf("  optimizer step: every rank holds the same weights: %s\n", same ? "yes" : "DIFFERENT");
    all_averaged = all_averaged && averaged;
    all_same = all_same && same;
  }

  // ---- the same steps through the library's DistributedDataParallel ----
  std::vector<std::vector<float>> ddp_weights(static_cast<size_t>(n));
  std::string buckets;
  ok = run_ranks(n, [&](int rank, std::shared_ptr<comm::ProcessGroup> group) {
    auto model = make_model(uint64_t(1000 + rank));
    // Limits of one byte: every parameter in a bucket of its own, the textbook's opposite.
    nn::DistributedDataParallel ddp(*model, std::move(group), {.bucket_cap_mb = 1e-6, .first_bucket_mb = 1e-6});
    nn::Adam optimizer(ddp.named_parameters(), kLearningRate);
    nn::CrossEntropyLoss criterion;
    for (int64_t step = 0; step < steps; ++step) {
      auto [x, y] = batch(data, rank, n, step);
      optimizer.zero_grad();
      criterion.forward(ddp.forward(x), y);
      ddp.backward(criterion.backward(), /*want_input_grad=*/false);  // waits for every bucket
      optimizer.step();
    }
    ddp_weights[size_t(rank)] = flat_weights(*model);
    if (rank == 0) buckets = ddp.describe_buckets();  // as rebuilt after the first step
  });
  if (!ok) return command_line::kFailed;
  bool same_as_ddp = true;
  for (int r = 0; r < n; ++r) same_as_ddp = same_as_ddp && ddp_weights[size_t(r)] == logs[size_t(r)].back().weights;
  std::printf(
      "\nThe same %lld step(s) through nn::DistributedDataParallel, whose Reducer all-reduces these "
      "buckets:\n%s",
      (long long)steps, buckets.c_str());
  std::printf("final weights: %s\n",
              same_as_ddp ? "the same weights to the last bit, on every rank" : "DIFFERENT from the textbook's");
  return all_averaged && all_same && same_as_ddp ? 0 : command_line::kFailed;
}
