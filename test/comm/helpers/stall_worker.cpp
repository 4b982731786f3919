// A worker for the stall tests: a small DDP training loop under tinyddp-run (env://), in which one
// rank stalls while the others go on, as a hung job does:
//
//   test_stall_worker --steps 50 --stall-rank 1 --stall-step 3 --stall stop    # raises SIGSTOP on itself
//   test_stall_worker --steps 50 --stall-rank 1 --stall-step 3 --stall sleep   # sleeps 60 s in its step
//
// Each step is a train step: forward, cross-entropy, backward (DDP launches the bucket all-reduces),
// then one small all-reduce of the loss. The stalling rank stalls inside the step, before backward,
// so the others wait for it in a bucket's all-reduce. Every rank prints "rank R finished" on success;
// a failure is printed on stderr and exits 1. The moments of the stall and of each failure are printed
// on CLOCK_MONOTONIC ("at_ms=..."), which every process of a host shares, so a test can measure how
// long the others took to fail.
#include <signal.h>
#include <unistd.h>

#include <iostream>
#include <thread>

#include <CLI/CLI.hpp>

#include "tinyddp/comm/process_group.h"
#include "tinyddp/core/error.h"
#include "tinyddp/core/random.h"
#include "tinyddp/nn/activations.h"
#include "tinyddp/nn/ddp/distributed_data_parallel.h"
#include "tinyddp/nn/linear.h"
#include "tinyddp/nn/loss.h"
#include "tinyddp/nn/sequential.h"

using namespace tinyddp;

namespace {
long long monotonic_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"stall worker"};
  int steps = 20, stall_rank = -1, stall_step = 0;
  std::string stall = "sleep";
  app.add_option("--steps", steps);
  app.add_option("--stall-rank", stall_rank);
  app.add_option("--stall-step", stall_step);
  app.add_option("--stall", stall)->check(CLI::IsMember({"sleep", "stop"}));
  CLI11_PARSE(app, argc, argv);
  try {
    auto group = comm::init_process_group("host", "env://");
    Generator gen(7);
    nn::Sequential model;
    model.emplace<nn::Linear>(32, 64, gen);
    model.emplace<nn::ReLU>();
    model.emplace<nn::Linear>(64, 4, gen);
    nn::DistributedDataParallel ddp(model, group);
    Tensor x = Tensor::empty({8, 32});
    fill_uniform(x, -1.f, 1.f, gen);
    Tensor y = Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 3, 0, 1, 2, 3});
    nn::CrossEntropyLoss criterion;
    for (int step = 0; step < steps; ++step) {
      float loss = criterion.forward(ddp.forward(x), y);
      if (group->rank() == stall_rank && step == stall_step) {
        std::cout << "rank " << group->rank() << " stalls in step " << step << " (" << stall
                  << ") at_ms=" << monotonic_ms() << std::endl;
        if (stall == "stop")
          raise(SIGSTOP);
        else
          std::this_thread::sleep_for(std::chrono::seconds(60));
      }
      ddp.backward(criterion.backward(), /*want_input_grad=*/false);
      Tensor total = Tensor::from_vector(std::vector<float>{loss});
      group->all_reduce(total)->wait();
    }
    group->barrier()->wait();
    std::cout << "rank " << group->rank() << " finished" << std::endl;
    return 0;
  } catch (const Error& e) {
    std::cerr << "failed at_ms=" << monotonic_ms() << ": " << e.what() << std::endl;
    return 1;
  }
}
