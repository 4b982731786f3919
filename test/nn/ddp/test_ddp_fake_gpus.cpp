// DistributedDataParallel and ZeRO-1 over the nccl backend, on 2 fake CUDA devices
// (test/support/fake_cuda.h): NCCL moves only its communicator's device memory, so every collective
// DDP makes -- the replica check at construction, the parameter broadcast, the bucket all-reduces
// or reduce-scatters, ZeRO-1's all-gathers, the rebuild broadcast after the first iteration -- must
// use tensors on the model's device. Ranks are threads, each on its own device; the weights after a
// few steps are compared with the same training on CPU ranks over the host backend, and the
// compressing hooks' buckets with their closed forms. The GPU suite runs the same checks on real
// devices (test/gpu/ddp_on_devices.h, test/gpu/test_gpu_ddp.cpp).
#include <doctest/doctest.h>

#include "test/gpu/ddp_on_devices.h"
#include "test/support/fake_cuda.h"

using namespace tinyddp;
using namespace tinyddp::testing;

namespace {

const RankPlacement kTwoFakeGpus{.backend = "nccl", .devices = {Device::cuda(0), Device::cuda(1)}, .exact = true};
const FakeCudaOptions kRanksAsThreads{.devices = 2, .one_device_per_process = false};

}  // namespace

TEST_CASE("DDP over the nccl backend on fake GPUs: constructs, trains, and agrees with the CPU ring") {
  FakeCudaDevices devices(kRanksAsThreads);
  check_training_against_cpu(kTwoFakeGpus, Training::ddp_sgd);
}

TEST_CASE(
    "ZeRO-1 over the nccl backend on fake GPUs: reduce-scatter, shard step, in-place all-gather equal the CPU's") {
  FakeCudaDevices devices(kRanksAsThreads);
  check_training_against_cpu(kTwoFakeGpus, Training::zero1_adam);
}

TEST_CASE("bf16_compress and fp16_compress over the nccl backend on fake GPUs give their closed forms") {
  FakeCudaDevices devices(kRanksAsThreads);
  check_compress_hooks(kTwoFakeGpus);
}

TEST_CASE("the GPU suite's one-GPU checks on one fake GPU: host backend, 2 ranks on cuda:0, against the CPU") {
  // What test/gpu/test_gpu_ddp.cpp runs where there is one GPU (NCCL takes one GPU per rank): the
  // host backend stages the CUDA tensors of both ranks through pinned host memory.
  FakeCudaDevices devices({.devices = 1, .one_device_per_process = false});
  const RankPlacement one_gpu{.backend = "host", .devices = {Device::cuda(0), Device::cuda(0)}, .exact = true};
  check_collectives_ddp_and_zero_use(one_gpu);
  check_training_against_cpu(one_gpu, Training::zero1_adam);
  check_compress_hooks(one_gpu);
}
