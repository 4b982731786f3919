// What DDP, ZeRO-1 and MultiDevice ask of the GPUs, on real devices: the collectives they call, the
// compressing comm hooks, and training runs compared with the same runs on CPU ranks. The checks are
// those the fake-device tests of make test run (test/gpu/ddp_on_devices.h,
// test/gpu/multi_device_on_devices.h); here the comparisons with the CPU take a tolerance, since
// cuBLAS orders its sums otherwise than the CPU GEMM.
//
// NCCL takes one GPU per rank: ncclCommInitRank refuses two ranks of a communicator on one device
// ("Duplicate GPU detected"). So on a machine with one GPU the nccl checks cannot run; the same
// checks run there over the host backend with 2 ranks on cuda:0 (CUDA tensors staged through pinned
// host memory), and the skip says what a second GPU would add.
#include <doctest/doctest.h>

#include <algorithm>

#include "tinyddp/comm/process_group.h"
#include "test/gpu/ddp_on_devices.h"
#include "test/gpu/gpu_test_support.h"
#include "test/gpu/multi_device_on_devices.h"
#include "test/test_skip.h"

using namespace tinyddp;
using namespace tinyddp::testing;

namespace {

// One rank per GPU over nccl, `limit` GPUs at most.
RankPlacement nccl_ranks(int limit) {
  RankPlacement placement{.backend = "nccl", .exact = false};
  for (int d = 0; d < std::min(limit, cuda_device_count()); ++d) placement.devices.push_back(Device::cuda(d));
  return placement;
}

const RankPlacement kHostOnOneGpu{.backend = "host", .devices = {Device::cuda(0), Device::cuda(0)}, .exact = false};

}  // namespace

TEST_CASE("GPU host backend, 2 ranks on cuda:0: the collectives DDP and ZeRO-1 use agree with the reference") {
  if (!gpu_available()) return;
  check_collectives_ddp_and_zero_use(kHostOnOneGpu);
}

TEST_CASE("GPU nccl backend, one rank per GPU: the collectives DDP and ZeRO-1 use agree with the reference") {
  if (!gpu_available()) return;
  if (const std::string why = nccl_ranks_unavailable_reason(); !why.empty()) TINYDDP_SKIP(why);
  check_collectives_ddp_and_zero_use(nccl_ranks(cuda_device_count()));
}

TEST_CASE("GPU DDP + SGD and ZeRO-1 + Adam: weights after 3 steps are the CPU's within a tolerance") {
  if (!gpu_available()) return;
  for (Training how : {Training::ddp_sgd, Training::zero1_adam}) check_training_against_cpu(kHostOnOneGpu, how);
  if (const std::string why = nccl_ranks_unavailable_reason(); !why.empty()) TINYDDP_SKIP(why);
  for (Training how : {Training::ddp_sgd, Training::zero1_adam})
    check_training_against_cpu(nccl_ranks(cuda_device_count()), how);
}

TEST_CASE("GPU bf16_compress and fp16_compress give their closed forms") {
  if (!gpu_available()) return;
  check_compress_hooks(kHostOnOneGpu);
  if (const std::string why = nccl_ranks_unavailable_reason(); !why.empty()) TINYDDP_SKIP(why);
  check_compress_hooks(nccl_ranks(2));
}

TEST_CASE(
    "GPU MultiDevice with 2 workers on cuda:0 over the host backend ends with the weights of the same job on 2 CPU "
    "workers") {
  if (!gpu_available()) return;
  check_multi_device_against_cpu({Device::cuda(0), Device::cuda(0)},
                                 "GPU MultiDevice with 2 workers on cuda:0 over the host backend ends with the weights "
                                 "of the same job on 2 CPU workers",
                                 /*exact=*/false, "host");
}

TEST_CASE("GPU MultiDevice on 2 GPUs over nccl ends with the weights of the same job on 2 CPU workers") {
  if (!gpu_available()) return;
  if (const std::string why = nccl_ranks_unavailable_reason(); !why.empty()) TINYDDP_SKIP(why);
  check_multi_device_against_cpu(
      {Device::cuda(0), Device::cuda(1)},
      "GPU MultiDevice on 2 GPUs over nccl ends with the weights of the same job on 2 CPU workers",
      /*exact=*/false);
}
