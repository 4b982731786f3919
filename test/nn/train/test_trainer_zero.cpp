// MultiDevice's zero_stage and comm_hook: the combinations it cannot honour are refused before anything runs.
// (The training itself is checked end to end in test/examples: digits --zero 1 against --zero 0.)
#include <doctest/doctest.h>

#include "tinyddp/core/error.h"
#include "tinyddp/nn/train/addons/multi_device.h"

using namespace tinyddp;
using namespace tinyddp::nn;

TEST_CASE("MultiDevice refuses a ZeRO stage it does not have") {
  MultiDeviceOptions options;
  TrainerOptions trainer;
  options.zero_stage = 2;
  CHECK_THROWS_WITH_AS(multi_device::check_zero_options(options, trainer), doctest::Contains("stages 2 and 3"), Error);
  options.zero_stage = 1;
  trainer.gradient_clip = 1.0;  // clipped over the shards (ZeroRedundancyOptimizer::clip_grad_norm)
  trainer.non_finite_loss = NonFiniteLoss::skip_step;
  multi_device::check_zero_options(options, trainer);
}

TEST_CASE("MultiDevice refuses a comm hook it does not know, and a compressing hook with ZeRO-1") {
  MultiDeviceOptions options;
  multi_device::check_comm_hook(options);  // none: the default all-reduce
  options.comm_hook = "bf16";
  CHECK_THROWS_WITH_AS(multi_device::check_comm_hook(options), doctest::Contains("unknown comm hook 'bf16'"), Error);
  options.comm_hook = "bf16_compress";
  multi_device::check_comm_hook(options);
  options.zero_stage = 1;
  CHECK_THROWS_WITH_AS(multi_device::check_comm_hook(options),
                       doctest::Contains("ZeRO-1 reduces the buckets with its own hook"), Error);
  options.comm_hook = "allreduce";
  multi_device::check_comm_hook(options);
}
