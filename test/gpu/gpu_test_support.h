// What every GPU test shares: whether it may run, and how NCCL's averages are compared.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "tinyddp/comm/process_group.h"
#include "tinyddp/core/cuda_runtime.h"
#include "test/test_skip.h"

namespace tinyddp::testing {

// True when the test can run on a real GPU. Otherwise the test is skipped with the reason -- or, with
// TINYDDP_REQUIRE_GPU=1 (make test-gpu's default), fails with it: a GPU suite that skipped everything
// must not pass.
inline bool gpu_available() {
  if (cuda_device_count() > 0 && !cuda_devices_are_fake()) return true;
  const std::string why = cuda_devices_are_fake() ? "fake CUDA devices are in use" : cuda_unavailable_reason();
  const char* require = std::getenv("TINYDDP_REQUIRE_GPU");
  if (require && std::string(require) == "1") {
    FAIL_CHECK("no GPU to test on, and TINYDDP_REQUIRE_GPU=1: " << why);
    return false;
  }
  TINYDDP_RECORD_SKIP("no CUDA device: ", why);
  return false;
}

// Why the nccl checks with two ranks or more cannot run here, or "" when they can (two GPUs or more,
// NCCL loaded). NCCL takes one GPU per rank: two ranks of a communicator on one device end in
// ncclCommInitRank's "Duplicate GPU detected", so one GPU gives NCCL only a world of 1, a copy.
inline std::string nccl_ranks_unavailable_reason() {
  const auto backends = comm::available_backends();
  if (std::find(backends.begin(), backends.end(), "nccl") == backends.end())
    return "the nccl backend is not available: " + comm::backend_unavailable_reason("nccl");
  if (cuda_device_count() < 2)
    return "one GPU: NCCL takes one GPU per rank (two ranks on one device end in ncclCommInitRank's \"Duplicate "
           "GPU detected\"), so NCCL ran only a world of 1 and the DDP checks ran over the host backend with 2 "
           "ranks on cuda:0; a second GPU adds NCCL's own kernels for them (its ring between devices, its 16-bit "
           "sums, its premultiplied average) and the nccl backend's stream ordering on two devices";
  return "";
}

// NCCL's avg of floats multiplies each rank's value by 1/n (rounded to float) and then sums, in an
// order of its own: it is not sum/n to the bit (for n not a power of two). Within a few units in the
// last place of the largest term it is.
inline bool close_to_average(const std::vector<float>& got, const std::vector<float>& exact, int world,
                             const std::vector<float>& largest_input) {
  if (got.size() != exact.size()) return false;
  for (size_t i = 0; i < got.size(); ++i) {
    const double ulp = std::ldexp(1.0, std::ilogb(std::max(1e-30f, std::fabs(largest_input[i]))) - 23);
    if (std::fabs(double(got[i]) - double(exact[i])) > 2.0 * double(world) * ulp) return false;
  }
  return true;
}

}  // namespace tinyddp::testing
