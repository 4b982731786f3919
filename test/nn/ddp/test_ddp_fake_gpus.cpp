// DistributedDataParallel over the nccl backend, on fake CUDA devices (test/support/fake_cuda.h): NCCL moves
// only its communicator's device memory, so every collective DDP makes -- the replica check at
// construction, the parameter broadcast, the bucket all-reduces, the rebuild broadcast after the first
// iteration -- must use tensors on the model's device. Ranks are threads, each on its own device;
// the trained weights are compared with the same training on the CPU over the host backend.
#include <doctest/doctest.h>

#include "tinyddp/core/cuda_runtime.h"
#include "tinyddp/kernels/ops.h"
#include "tinyddp/nn/ddp/distributed_data_parallel.h"
#include "tinyddp/nn/optim/sgd.h"
#include "test/nn/ddp/test_ddp_support.h"
#include "test/support/fake_cuda.h"
#include "test/test_support.h"

using namespace tinyddp;
using namespace tinyddp::testing;

namespace {

// Three SGD steps of DDP on each rank's half of a batch; returns every rank's final weights.
std::vector<std::vector<float>> train(const std::vector<std::shared_ptr<comm::ProcessGroup>>& groups, bool on_gpus) {
  const int world = int(groups.size());
  std::vector<std::vector<float>> weights(static_cast<size_t>(world));
  Tensor x = random_features(16, 5, 1), y = random_labels(16, 3, 2);
  run_ranks(world, [&](int r) {
    const Device device = on_gpus ? Device::cuda(r) : Device::cpu();
    if (on_gpus) cuda_set_device(r);
    auto model = make_mlp({5, 7, 3}, 42);
    model->to(device);
    nn::DistributedDataParallel ddp(*model, groups[size_t(r)]);
    nn::SGD sgd(model->named_parameters(), 0.1);
    std::vector<int64_t> mine;
    for (int64_t i = r; i < 16; i += world) mine.push_back(i);
    for (int step = 0; step < 3; ++step) {
      sgd.zero_grad();
      train_step_backward(ddp, gather_rows<float>(x, mine).to(device), gather_rows<int64_t>(y, mine).to(device));
      sgd.step();
    }
    weights[size_t(r)] = flat_values(*model);
  });
  return weights;
}

}  // namespace

TEST_CASE("DDP over the nccl backend on fake GPUs: constructs, trains, and agrees with the CPU ring") {
  kernels::set_cpu_threads(1);  // both runs' products on one GEMM thread: no library splits them differently
  std::vector<std::vector<float>> on_cpu = train(make_test_groups(2), false);
  FakeCudaDevices devices({.devices = 2, .one_device_per_process = false});
  std::vector<std::vector<float>> on_gpus;
  {
    auto store = std::make_shared<comm::HashStore>();
    std::vector<std::shared_ptr<comm::ProcessGroup>> groups(2);
    run_ranks(2, [&](int r) {
      comm::ProcessGroupOptions options;
      options.timeout = std::chrono::seconds(60);
      options.device = r;
      groups[size_t(r)] = comm::create_process_group("nccl", store, r, 2, options);
    });
    on_gpus = train(groups, true);
  }
  check_identical(on_gpus[1], on_gpus[0], "rank 1 vs rank 0 on fake GPUs");  // the replicas stayed identical
  // A fake GPU runs the CPU kernels on its memory, so each rank computes the products the CPU run
  // computes. NCCL averages by multiplying by 1/2 before summing, the ring sums and then halves: both
  // exact scalings by a power of two around one rounded addition, so the same bits.
  check_identical(on_gpus[0], on_cpu[0], "weights after 3 steps on fake GPUs against the CPU");
}
