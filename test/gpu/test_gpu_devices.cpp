// The device query: what this process sees of CUDA and NCCL, one fact per line, so that a person (or
// the GPU bundle's run_checks.sh, which runs it first and reads "cuda devices: N") sees what the other
// checks will run on. Fails where there is no GPU to test on (TINYDDP_REQUIRE_GPU=1), saying why.
#include <doctest/doctest.h>

#include <iostream>

#include "tinyddp/comm/process_group.h"
#include "tinyddp/core/cuda_runtime.h"
#include "test/gpu/gpu_test_support.h"

using namespace tinyddp;

TEST_CASE("device query: the CUDA devices and the NCCL this process sees") {
  const int count = cuda_device_count();
  std::cout << "cuda devices: " << count << "\n";
  if (count == 0) std::cout << "no CUDA device: " << cuda_unavailable_reason() << "\n";
  for (int d = 0; d < count; ++d) std::cout << "cuda:" << d << ": " << (cuda_free_memory(d) >> 20) << " MiB free\n";
  const std::string nccl = comm::backend_unavailable_reason("nccl");
  std::cout << "nccl: " << (nccl.empty() ? "available" : "unavailable: " + nccl) << "\n" << std::flush;
  if (!testing::gpu_available()) return;
  CHECK(count > 0);
}
