// DistributedDataParallel with threads acting as ranks (one host process group per thread over a
// HashStore): training equals single-process training on the same global batches, gradients are views
// into the buckets, buckets start strictly in order, the rebuild after the first iteration, no_sync
// accumulation and the broadcast of rank 0's weights. The references are independent: a plain model
// trained in one process, or gradients whose average the test knows in closed form.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "tinyddp/kernels/ops.h"
#include "tinyddp/nn/data/distributed_sampler.h"
#include "tinyddp/nn/ddp/distributed_data_parallel.h"
#include "tinyddp/nn/optim/adam.h"
#include "test/nn/ddp/test_ddp_support.h"
#include "test/test_support.h"

using namespace tinyddp;
using namespace tinyddp::nn;
using namespace tinyddp::testing;
using Indices = std::vector<size_t>;

namespace {

const std::vector<int64_t> kWidths{12, 16, 16, 3};
constexpr int64_t kSamples = 32, kBatch = 4, kSteps = 4;

}  // namespace

TEST_CASE("2-rank DDP training equals single-process training on the same global batches") {
  // One GEMM thread in every rank and in the reference, so that no library splits a product's sums
  // differently between them: the comparison below is bitwise.
  kernels::set_cpu_threads(1);
  const Tensor x = random_features(kSamples, kWidths.front(), 1);
  const Tensor y = random_labels(kSamples, kWidths.back(), 2);
  auto groups = make_test_groups(2);
  std::vector<std::vector<float>> final_weights(2);
  run_ranks(2, [&](int rank) {
    // Rank 1 starts from other weights: DDP must replace them with rank 0's.
    auto model = make_mlp(kWidths, rank == 0 ? 7 : 1234);
    DistributedDataParallel ddp(*model, groups[size_t(rank)], {.bucket_cap_mb = 0.0005, .first_bucket_mb = 0.0001});
    Adam optimizer(ddp.named_parameters(), 0.01);
    DistributedSampler sampler(kSamples, 2, rank, {.shuffle = false});
    std::vector<int64_t> mine = sampler.indices();
    for (int64_t step = 0; step < kSteps; ++step) {
      std::vector<int64_t> batch(mine.begin() + step * kBatch, mine.begin() + (step + 1) * kBatch);
      optimizer.zero_grad();
      train_step_backward(ddp, gather_rows<float>(x, batch), gather_rows<int64_t>(y, batch));
      optimizer.step();
    }
    final_weights[size_t(rank)] = flat_values(*model);
  });

  // One process, one model, both ranks' batches at every step (8 samples, the mean of the two 4-sample
  // mean losses). Each rank's half-batch runs its own forward and backward, as on its rank, and the
  // gradients are averaged as the all-reduce averages: the same products in the same order, so the
  // same bits, on every GEMM library, ISA and thread count. (One GEMM over all 8 rows would add the
  // rows' contributions to a weight gradient in another order and agree to rounding only.)
  auto reference = make_mlp(kWidths, 7);
  Adam optimizer(reference->named_parameters(), 0.01);
  std::vector<std::vector<int64_t>> rank_indices{DistributedSampler(kSamples, 2, 0, {.shuffle = false}).indices(),
                                                 DistributedSampler(kSamples, 2, 1, {.shuffle = false}).indices()};
  for (int64_t step = 0; step < kSteps; ++step) {
    std::vector<float> averaged = gradients_as_ddp_averages(*reference, 2, [&](int rank) {
      const std::vector<int64_t>& mine = rank_indices[size_t(rank)];
      std::vector<int64_t> batch(mine.begin() + step * kBatch, mine.begin() + (step + 1) * kBatch);
      train_step_backward(*reference, gather_rows<float>(x, batch), gather_rows<int64_t>(y, batch));
    });
    optimizer.zero_grad();
    set_flat_grads(*reference, averaged);
    optimizer.step();
  }
  // The replicas are identical to the bit: the same averaged gradients and the same update everywhere.
  check_identical(final_weights[1], final_weights[0], "rank 1's weights vs rank 0's");
  check_identical(final_weights[0], flat_values(*reference), "DDP vs single process");
  CHECK(final_weights[0] != flat_values(*make_mlp(kWidths, 7)));  // it did train
}

TEST_CASE("every gradient is a view into its bucket's flat buffer and holds the ranks' average after backward") {
  kernels::set_cpu_threads(1);  // as in the ranks: the reference's products split no differently
  const Tensor x = random_features(8, kWidths.front(), 3);
  const Tensor y = random_labels(8, kWidths.back(), 4);
  auto groups = make_test_groups(2);
  std::vector<std::vector<float>> grads(2);
  run_ranks(2, [&](int rank) {
    auto model = make_mlp(kWidths, 5);
    DistributedDataParallel ddp(*model, groups[size_t(rank)], {.bucket_cap_mb = 0.0005, .first_bucket_mb = 0.0001});
    Reducer& reducer = ddp.reducer();
    auto check_views = [&] {
      for (size_t b = 0; b < reducer.buckets().size(); ++b) {
        int64_t offset = 0;
        for (size_t index : reducer.buckets()[b].parameters) {
          Parameter& p = *reducer.parameters()[index].parameter;
          CHECK(p.grad.shares_storage_with(reducer.bucket_buffer(b)));
          CHECK(p.grad.raw_data() == static_cast<const float*>(reducer.bucket_buffer(b).raw_data()) + offset);
          offset += p.value.numel();
        }
        CHECK(offset == reducer.bucket_buffer(b).numel());
      }
    };
    check_views();
    std::vector<int64_t> rows{rank * 4, rank * 4 + 1, rank * 4 + 2, rank * 4 + 3};
    train_step_backward(ddp, gather_rows<float>(x, rows), gather_rows<int64_t>(y, rows));
    check_views();  // after the rebuild too
    grads[size_t(rank)] = flat_grads(*model);
  });
  // Reference: each rank's local gradient in a plain model, averaged as the all-reduce averages.
  auto model = make_mlp(kWidths, 5);
  std::vector<float> expected = gradients_as_ddp_averages(*model, 2, [&](int rank) {
    std::vector<int64_t> rows{rank * 4, rank * 4 + 1, rank * 4 + 2, rank * 4 + 3};
    train_step_backward(*model, gather_rows<float>(x, rows), gather_rows<int64_t>(y, rows));
  });
  check_identical(grads[1], grads[0], "rank 1's gradients vs rank 0's");
  check_identical(grads[0], expected, "averaged gradients");
}

TEST_CASE("bucket layout of the bench MLP: reverse registration order at first, then rebuilt in the ready order") {
  auto groups = make_test_groups(2);
  run_ranks(2, [&](int rank) {
    auto model = make_mlp({784, 1024, 1024, 10}, 0);
    DistributedDataParallel ddp(*model, groups[size_t(rank)]);  // PyTorch's defaults: 1 MiB, then 25 MiB
    const Reducer& reducer = ddp.reducer();
    REQUIRE(reducer.buckets().size() == 2);
    CHECK(reducer.buckets()[0].parameters == Indices{5, 4, 3, 2});
    CHECK(reducer.buckets()[0].bytes == 4239400);
    CHECK(reducer.buckets()[1].parameters == Indices{1, 0});
    CHECK(ddp.describe_buckets() ==
          "bucket 0: 4.0 MiB (4239400 bytes, limit 1.0 MiB): 4.bias, 4.weight, 2.bias, 2.weight\n"
          "bucket 1: 3.1 MiB (3215360 bytes, limit 25.0 MiB): 0.bias, 0.weight\n");
    CHECK_FALSE(reducer.buckets_rebuilt());

    train_step_backward(ddp, random_features(2, 784, 10 + uint64_t(rank)), random_labels(2, 10, 20 + uint64_t(rank)));
    // Last layer first, each Linear's bias before its weight, as PyTorch's autograd (test_layers.cpp
    // checks that order against PyTorch's): exactly reverse registration order, so the rebuild lays
    // out the same buckets that PyTorch's DDP ends up with.
    CHECK(reducer.last_ready_order() == Indices{5, 4, 3, 2, 1, 0});
    CHECK(reducer.buckets_rebuilt());
    REQUIRE(reducer.buckets().size() == 2);
    CHECK(reducer.buckets()[0].parameters == Indices{5, 4, 3, 2});  // 4239400 B >= 1 MiB
    CHECK(reducer.buckets()[0].bytes == 4239400);
    CHECK(reducer.buckets()[1].parameters == Indices{1, 0});
    CHECK(reducer.iterations() == 1);
  });
}

TEST_CASE("the rebuild keeps the averaged gradients and uses rank 0's order on every rank") {
  auto groups = make_test_groups(2);
  std::vector<std::vector<BucketSpec>> layouts(2);
  run_ranks(2, [&](int rank) {
    ScriptedModule module({4, 4, 4, 4}, rank);  // 16 B each; first bucket 16 B, cap 32 B
    DistributedDataParallel ddp(module, groups[size_t(rank)],
                                {.bucket_cap_mb = 32.0 / (1 << 20), .first_bucket_mb = 16.0 / (1 << 20)});
    // Planned in reverse: {3}, {2, 1}, {0}. The ranks then see different ready orders.
    CHECK(ddp.reducer().buckets().size() == 3);
    module.mark_order = rank == 0 ? Indices{1, 0, 2, 3} : Indices{3, 2, 1, 0};
    ddp.forward(Tensor::zeros({1}));
    ddp.backward(Tensor::zeros({1}));
    CHECK(ddp.reducer().buckets_rebuilt());
    layouts[size_t(rank)] = ddp.reducer().buckets();
    // (1 + 2) / 2 in every element, moved into the new buffers.
    for (size_t i = 0; i < 4; ++i) CHECK(module.param(i).grad.to_vector<float>() == std::vector<float>(4, 1.5f));
  });
  for (int rank = 0; rank < 2; ++rank) {
    REQUIRE(layouts[size_t(rank)].size() == 3);
    CHECK(layouts[size_t(rank)][0].parameters == Indices{1});
    CHECK(layouts[size_t(rank)][1].parameters == Indices{0, 2});
    CHECK(layouts[size_t(rank)][2].parameters == Indices{3});
  }
}

TEST_CASE("a bucket's all-reduce starts when it is complete and every earlier bucket has started, never sooner") {
  auto groups = make_test_groups(2);
  run_ranks(2, [&](int rank) {
    auto group = std::make_shared<RecordingGroup>(groups[size_t(rank)]);
    ScriptedModule module({4, 4, 4}, rank);  // one 16-byte bucket each: planned {2}, {1}, {0}
    DistributedDataParallel ddp(module, group,
                                {.bucket_cap_mb = 16.0 / (1 << 20),
                                 .first_bucket_mb = 16.0 / (1 << 20),
                                 .rebuild_buckets = false});
    REQUIRE(ddp.reducer().buckets().size() == 3);
    const void* buffer[3];
    for (size_t b = 0; b < 3; ++b) buffer[b] = ddp.reducer().bucket_buffer(b).raw_data();
    // Backward finishes parameter 0 (bucket 2) first: it must wait for buckets 0 and 1.
    module.mark_order = {0, 2, 1};
    std::vector<size_t> launched_after_mark;
    module.after_mark = [&](size_t) { launched_after_mark.push_back(group->all_reduces.size()); };
    ddp.forward(Tensor::zeros({1}));
    ddp.backward(Tensor::zeros({1}));
    // After p0: nothing (bucket 0 is not complete). After p2: bucket 0. After p1: buckets 1 and 2.
    CHECK(launched_after_mark == std::vector<size_t>{0, 1, 3});
    REQUIRE(group->all_reduces.size() == 3);
    for (size_t b = 0; b < 3; ++b) {
      CHECK(group->all_reduces[b].data == buffer[b]);
      CHECK(group->all_reduces[b].numel == 4);
      CHECK(group->all_reduces[b].op == comm::ReduceOp::avg);  // the division by the world size
    }
  });
}

TEST_CASE("no_sync: micro-batches accumulate locally, and the next synchronised backward averages the sum") {
  kernels::set_cpu_threads(1);  // as in the ranks: the reference's products split no differently
  const Tensor x = random_features(16, kWidths.front(), 5);
  const Tensor y = random_labels(16, kWidths.back(), 6);
  auto batch_of = [&](int rank, int micro) {
    std::vector<int64_t> rows;
    for (int64_t i = 0; i < 4; ++i) rows.push_back(rank * 8 + micro * 4 + i);
    return rows;
  };
  auto groups = make_test_groups(2);
  std::vector<std::vector<float>> local(2), synced(2);
  std::vector<size_t> all_reduces_under_no_sync(2);
  run_ranks(2, [&](int rank) {
    auto group = std::make_shared<RecordingGroup>(groups[size_t(rank)]);
    auto model = make_mlp(kWidths, 8);
    DistributedDataParallel ddp(*model, group);
    // A whole synchronised step first, then zero_grad (set to none, the default): the buckets keep
    // that step's numbers, which the next backward must overwrite, not add to. Poisoned with NaN,
    // any of them that leaked into the accumulation would show.
    {
      auto rows = batch_of(rank, 1);
      train_step_backward(ddp, gather_rows<float>(x, rows), gather_rows<int64_t>(y, rows));
    }
    ddp.zero_grad();
    for (const NamedParameter& named : ddp.named_parameters()) {
      CHECK_FALSE(named.parameter->has_grad);
      kernels::fill(named.parameter->grad, std::nanf(""));
    }
    const size_t all_reduces_before = group->all_reduces.size();
    // A forward with no backward (an evaluation) arms the reducer; the no_sync() forward disarms it.
    ddp.forward(gather_rows<float>(x, batch_of(rank, 1)));
    {
      auto guard = ddp.no_sync();
      CHECK_FALSE(ddp.require_gradient_sync());
      auto rows = batch_of(rank, 0);
      train_step_backward(ddp, gather_rows<float>(x, rows), gather_rows<int64_t>(y, rows));
    }
    CHECK(ddp.require_gradient_sync());
    all_reduces_under_no_sync[size_t(rank)] = group->all_reduces.size() - all_reduces_before;
    local[size_t(rank)] = flat_grads(*model);
    auto rows = batch_of(rank, 1);
    train_step_backward(ddp, gather_rows<float>(x, rows), gather_rows<int64_t>(y, rows));
    synced[size_t(rank)] = flat_grads(*model);
  });
  CHECK(all_reduces_under_no_sync == std::vector<size_t>{0, 0});
  CHECK(local[0] != local[1]);  // nothing was exchanged yet
  // Reference: every rank's two micro-batch gradients accumulated in a plain model (the same GEMMs with
  // beta = 1 that the ranks ran), then averaged over ranks as the all-reduce averages.
  auto model = make_mlp(kWidths, 8);
  std::vector<float> expected = gradients_as_ddp_averages(*model, 2, [&](int rank) {
    for (int micro = 0; micro < 2; ++micro) {
      auto rows = batch_of(rank, micro);
      train_step_backward(*model, gather_rows<float>(x, rows), gather_rows<int64_t>(y, rows));
    }
  });
  check_identical(synced[1], synced[0], "rank 1's gradients vs rank 0's");
  check_identical(synced[0], expected, "accumulated then averaged gradients");
}

TEST_CASE("construction broadcasts rank 0's weights; world size 1 leaves gradients as they are") {
  auto groups = make_test_groups(2);
  std::vector<std::vector<float>> weights(2);
  run_ranks(2, [&](int rank) {
    auto model = std::shared_ptr<Module>(make_mlp(kWidths, uint64_t(100 + rank)));
    DistributedDataParallel ddp(model, groups[size_t(rank)]);  // the shared_ptr form keeps the model alive
    weights[size_t(rank)] = flat_values(ddp.module());
  });
  CHECK(weights[0] == weights[1]);
  CHECK(weights[0] == flat_values(*make_mlp(kWidths, 100)));

  auto single = make_test_groups(1);
  auto model = make_mlp(kWidths, 9);
  auto plain = make_mlp(kWidths, 9);
  DistributedDataParallel ddp(*model, single[0]);
  const Tensor x = random_features(4, kWidths.front(), 1);
  const Tensor y = random_labels(4, kWidths.back(), 1);
  train_step_backward(ddp, x, y);
  train_step_backward(*plain, x, y);
  CHECK(flat_grads(*model) == flat_grads(*plain));
}

TEST_CASE("the wrapper: PyTorch's names without a 'module.' prefix, a description, and refusals") {
  auto single = make_test_groups(1);
  auto model = make_mlp({4, 3}, 0);
  DistributedDataParallel ddp(*model, single[0]);
  std::vector<std::string> names;
  for (auto& named : ddp.named_parameters()) names.push_back(named.name);
  CHECK(names == std::vector<std::string>{"0.weight", "0.bias"});
  CHECK(&ddp.parameter("0.bias") == &model->parameter("0.bias"));
  CHECK(ddp.describe() ==
        "DistributedDataParallel(\n  (module): Sequential(\n    (0): Linear(in_features=4, "
        "out_features=3, bias=True)\n  )\n)");
  CHECK(&ddp.module() == model.get());
  CHECK_THROWS_WITH(ddp.to(Device::cpu()), doctest::Contains("before wrapping it"));
  CHECK_THROWS_WITH([&] { DistributedDataParallel wrong(*model, nullptr); }(),
                    doctest::Contains("process group is null"));
  CHECK_THROWS_WITH([&] { DistributedDataParallel wrong(*model, single[0], {.bucket_cap_mb = 0}); }(),
                    doctest::Contains("bucket_cap_mb is 0"));
  ReLU no_parameters;
  CHECK_THROWS_WITH([&] { DistributedDataParallel wrong(no_parameters, single[0]); }(),
                    doctest::Contains("has no parameters"));
}
