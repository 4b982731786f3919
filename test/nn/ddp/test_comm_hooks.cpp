// DistributedDataParallel::register_comm_hook: a user's hook replaces the bucket all-reduce and
// keeps the contract (the buffer holds the average when its future completes), the hook sees the
// bucket as it is laid out, errors name the bucket, and registration is refused when too late or
// twice. References: the closed-form average of ScriptedModule's gradients, and the default hook.
#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <vector>

#include "tinyddp/core/error.h"
#include "tinyddp/kernels/ops.h"
#include "tinyddp/nn/ddp/distributed_data_parallel.h"
#include "test/nn/ddp/test_ddp_support.h"
#include "test/test_support.h"

using namespace tinyddp;
using namespace tinyddp::nn;
using namespace tinyddp::testing;

namespace {

const std::vector<int64_t> kWidths{12, 16, 16, 3};
const DdpOptions kSmallBuckets{.bucket_cap_mb = 0.0005, .first_bucket_mb = 0.0001};

// The user's hook of the test: sum over the ranks, then its own division by the world size.
CommHookFuture sum_then_divide(comm::ProcessGroup& group, GradBucket& bucket) {
  comm::WorkPtr work = group.all_reduce(bucket.buffer, comm::ReduceOp::sum, bucket.call_options());
  return CommHookFuture(work, [buffer = bucket.buffer, world = group.size()]() mutable {
    float* data = buffer.data<float>();
    for (int64_t i = 0; i < buffer.numel(); ++i) data[i] /= float(world);
  });
}

}  // namespace

TEST_CASE("a user's comm hook that sums and then divides gives the default hook's gradients") {
  constexpr int kWorld = 3;
  const Tensor x = random_features(12, kWidths.front(), 1);
  const Tensor y = random_labels(12, kWidths.back(), 2);
  auto groups = make_test_groups(kWorld);
  std::vector<std::vector<float>> with_hook(kWorld), with_default(kWorld);
  std::vector<std::vector<size_t>> hook_calls(kWorld);
  run_ranks(kWorld, [&](int rank) {
    std::vector<int64_t> rows{rank * 4, rank * 4 + 1, rank * 4 + 2, rank * 4 + 3};
    for (bool hooked : {true, false}) {
      auto model = make_mlp(kWidths, 7);
      DistributedDataParallel ddp(*model, groups[size_t(rank)], kSmallBuckets);
      if (hooked)
        ddp.register_comm_hook(nullptr, [&, rank](comm::ProcessGroup& group, GradBucket& bucket) {
          hook_calls[size_t(rank)].push_back(bucket.index);
          // The bucket as the hook sees it: each parameter's gradient is the view at its offset.
          for (size_t k = 0; k < bucket.parameters.size(); ++k) {
            Parameter& p = *ddp.named_parameters()[bucket.parameters[k]].parameter;
            CHECK(p.grad.raw_data() == bucket.buffer.view(bucket.offsets[k], {bucket.lengths[k]}).raw_data());
          }
          CHECK(bucket.last == (bucket.index + 1 == ddp.reducer().buckets().size()));
          return sum_then_divide(group, bucket);
        });
      for (int step = 0; step < 2; ++step) {  // the second step runs on the rebuilt buckets
        model->zero_grad();
        train_step_backward(ddp, gather_rows<float>(x, rows), gather_rows<int64_t>(y, rows));
      }
      (hooked ? with_hook : with_default)[size_t(rank)] = flat_grads(*model);
    }
  });
  const size_t buckets = hook_calls[0].size() / 2;
  REQUIRE(buckets > 1);
  for (int rank = 0; rank < kWorld; ++rank) {
    std::vector<size_t> expected;
    for (int step = 0; step < 2; ++step)
      for (size_t b = 0; b < buckets; ++b) expected.push_back(b);
    CHECK(hook_calls[size_t(rank)] == expected);  // once per bucket, in bucket order, every iteration
    // The same sum (the backend picks its algorithm, and so its order of additions, by size, not by op),
    // then the same one division by 3 in f32, here and in the backend: the same bits.
    check_identical(with_hook[size_t(rank)], with_default[size_t(rank)], "sum-then-divide hook vs default");
  }
  CHECK(with_hook[0] == with_hook[1]);
  CHECK(with_hook[0] == with_hook[2]);
}

TEST_CASE("a comm hook's result is what the optimizer sees: gradients of 1, 2, 3 average to 2") {
  constexpr int kWorld = 3;
  auto groups = make_test_groups(kWorld);
  std::vector<std::vector<float>> grads(kWorld);
  run_ranks(kWorld, [&](int rank) {
    ScriptedModule model({5, 7, 3}, rank);
    model.mark_order = {2, 1, 0};
    DistributedDataParallel ddp(model, groups[size_t(rank)], {.bucket_cap_mb = 0.00002, .first_bucket_mb = 0.00001});
    ddp.register_comm_hook(groups[size_t(rank)], sum_then_divide);
    model.zero_grad();
    ddp.forward(Tensor::zeros({1}));
    ddp.backward(Tensor::zeros({1}));
    grads[size_t(rank)] = flat_grads(model);
  });
  for (const auto& g : grads) CHECK(g == std::vector<float>(15, 2.f));  // (1 + 2 + 3) / 3, exact
}

TEST_CASE("a comm hook that fails names the bucket, whether it throws or its future fails") {
  constexpr int kWorld = 2;
  auto groups = make_test_groups(kWorld);
  std::vector<std::string> at_launch(kWorld), at_wait(kWorld);
  run_ranks(kWorld, [&](int rank) {
    ScriptedModule model({4, 4}, rank);
    model.mark_order = {1, 0};
    DistributedDataParallel ddp(model, groups[size_t(rank)]);
    ddp.register_comm_hook(nullptr, [](comm::ProcessGroup&, GradBucket&) -> CommHookFuture {
      TINYDDP_FAIL("compression table not loaded");
    });
    ddp.forward(Tensor::zeros({1}));
    try {
      ddp.backward(Tensor::zeros({1}));
    } catch (const Error& e) {
      at_launch[size_t(rank)] = e.message();
    }

    ScriptedModule second({4, 4}, rank);
    second.mark_order = {1, 0};
    DistributedDataParallel ddp2(second, groups[size_t(rank)]);
    ddp2.register_comm_hook(nullptr, [](comm::ProcessGroup& group, GradBucket& bucket) {
      return CommHookFuture(group.all_reduce(bucket.buffer, comm::ReduceOp::sum),
                            [] { TINYDDP_FAIL("decompression found a NaN"); });
    });
    ddp2.forward(Tensor::zeros({1}));
    try {
      ddp2.backward(Tensor::zeros({1}));
    } catch (const Error& e) {
      at_wait[size_t(rank)] = e.message();
    }
  });
  for (int rank = 0; rank < kWorld; ++rank) {
    CHECK(at_launch[size_t(rank)].find("comm hook failed on bucket 0") != std::string::npos);
    CHECK(at_launch[size_t(rank)].find("compression table not loaded") != std::string::npos);
    CHECK(at_wait[size_t(rank)].find("future failed for bucket 0") != std::string::npos);
    CHECK(at_wait[size_t(rank)].find("decompression found a NaN") != std::string::npos);
  }
}

TEST_CASE("register_comm_hook is refused a second time and after the first backward") {
  auto groups = make_test_groups(1);
  ScriptedModule model({3}, 0);
  model.mark_order = {0};
  {
    DistributedDataParallel ddp(model, groups[0]);
    ddp.register_comm_hook(nullptr, comm_hooks::allreduce);
    CHECK_THROWS_WITH_AS(ddp.register_comm_hook(nullptr, comm_hooks::allreduce),
                         doctest::Contains("already registered"), Error);
  }
  DistributedDataParallel ddp(model, groups[0]);
  ddp.forward(Tensor::zeros({1}));
  ddp.backward(Tensor::zeros({1}));
  CHECK_THROWS_WITH_AS(ddp.register_comm_hook(nullptr, comm_hooks::allreduce),
                       doctest::Contains("after a synchronised backward"), Error);
  CHECK_THROWS_WITH_AS(ddp.register_comm_hook(nullptr, nullptr), doctest::Contains("the hook is empty"), Error);
}
