// A training step reuses its memory: the activations, gradients and temporaries of one step have the
// same sizes as the last one's, so after the first step the CPU block cache (core/allocator.h) serves
// every large request and none reaches the C library (where it would cost page faults again).
#include <doctest/doctest.h>

#include "tinyddp/core/allocator.h"
#include "tinyddp/core/random.h"
#include "tinyddp/nn/activations.h"
#include "tinyddp/nn/linear.h"
#include "tinyddp/nn/loss.h"
#include "tinyddp/nn/optim/adam.h"
#include "tinyddp/nn/sequential.h"
#include "test/test_skip.h"
#include "test/test_support.h"

using namespace tinyddp;

TEST_CASE("after the first training step, no block of 64 KiB or more is allocated from the system again") {
#if defined(__SANITIZE_ADDRESS__)
  TINYDDP_SKIP("AddressSanitizer build, where the CPU block cache is off");
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  TINYDDP_SKIP("AddressSanitizer build, where the CPU block cache is off");
#endif
#endif
  cpu_cache_release();  // a cache filled to its limit by earlier tests would refuse this test's blocks
  Generator gen(3);
  nn::Sequential model;
  model.emplace<nn::Linear>(64, 256, gen);  // activations [128, 256] f32 = 128 KiB: cached sizes
  model.emplace<nn::ReLU>();
  model.emplace<nn::Linear>(256, 256, gen);
  model.emplace<nn::ReLU>();
  model.emplace<nn::Linear>(256, 10, gen);
  nn::Adam optimizer(model.named_parameters(), 1e-3);
  nn::CrossEntropyLoss loss_fn;
  Tensor x = Tensor::empty({128, 64});
  fill_uniform(x, 0.f, 1.f, gen);
  Tensor y = Tensor::zeros({128}, DType::i64);
  auto step = [&] {
    optimizer.zero_grad();
    loss_fn.forward(model.forward(x), y);
    model.backward(loss_fn.backward(), false);
    optimizer.step();
  };

  step();  // the first step allocates: activations, gradients of the activations, Adam's state
  const CpuCacheStats after_first = cpu_cache_stats();
  for (int i = 0; i < 3; ++i) step();
  const CpuCacheStats after_more = cpu_cache_stats();
  CHECK(after_more.system_allocations == after_first.system_allocations);
  // Each step takes at least its two hidden activations, their ReLU outputs and gradients back.
  CHECK(after_more.reuses >= after_first.reuses + 3 * 6);
  CHECK(after_more.bytes_cached > 0);

  cpu_cache_release();
  CHECK(cpu_cache_stats().bytes_cached == 0);
}
