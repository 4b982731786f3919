// The built-in compressing comm hooks (bf16_compress, fp16_compress, bf16_single_rounding) on real
// gradients of an MLP: every element of every bucket, on every rank, equals a reference computed
// here from the ranks' own gradients with an independent rounding (test/half_precision_reference.h,
// double arithmetic and nearbyint) and the arithmetic each hook promises: the ring's sum of two
// 16-bit values in f32 rounded once, the single-rounding sum in rank order rounded once.
#include <doctest/doctest.h>

#include <functional>
#include <vector>

#include "tinyddp/core/error.h"
#include "tinyddp/nn/ddp/distributed_data_parallel.h"
#include "test/half_precision_reference.h"
#include "test/nn/ddp/test_ddp_support.h"
#include "test/test_support.h"

using namespace tinyddp;
using namespace tinyddp::nn;
using namespace tinyddp::testing;

namespace {

const std::vector<int64_t> kWidths{12, 16, 16, 3};
const DdpOptions kSmallBuckets{.bucket_cap_mb = 0.0005, .first_bucket_mb = 0.0001};

float bf16(double x) { return float(round_to_format(x, kBf16)); }
float f16(double x) { return float(round_to_format(x, kF16)); }

// What each rank's buckets held before the hook ran, and the buffers that hold the result after.
struct SeenBuckets {
  std::vector<std::vector<float>> before;  // by bucket
  std::vector<Tensor> after;
};

// One backward on `world` ranks, each bucket reduced by `hook`; returns what every rank saw.
std::vector<SeenBuckets> reduce_with(int world, const CommHook& hook) {
  const Tensor x = random_features(4 * world, kWidths.front(), 11);
  const Tensor y = random_labels(4 * world, kWidths.back(), 12);
  auto groups = make_test_groups(world);
  std::vector<SeenBuckets> seen(static_cast<size_t>(world));
  run_ranks(world, [&](int rank) {
    auto model = make_mlp(kWidths, 7);
    DistributedDataParallel ddp(*model, groups[size_t(rank)], kSmallBuckets);
    SeenBuckets& mine = seen[size_t(rank)];
    ddp.register_comm_hook(nullptr, [&](comm::ProcessGroup& group, GradBucket& bucket) {
      mine.before.push_back(bucket.buffer.to_vector<float>());
      mine.after.push_back(bucket.buffer);
      return hook(group, bucket);
    });
    std::vector<int64_t> rows{rank * 4, rank * 4 + 1, rank * 4 + 2, rank * 4 + 3};
    model->zero_grad();
    train_step_backward(ddp, gather_rows<float>(x, rows), gather_rows<int64_t>(y, rows));
  });
  return seen;
}

// Every rank's result for every element against reference(values of the ranks at that element).
void check_against(const std::vector<SeenBuckets>& seen,
                   const std::function<float(const std::vector<float>&)>& reference) {
  REQUIRE(seen[0].before.size() > 1);  // several buckets
  size_t inexact = 0;
  for (size_t b = 0; b < seen[0].before.size(); ++b)
    for (size_t i = 0; i < seen[0].before[b].size(); ++i) {
      std::vector<float> values;
      for (const auto& rank : seen) values.push_back(rank.before[b][i]);
      const float expected = reference(values);
      for (size_t r = 0; r < seen.size(); ++r) {
        const float got = seen[r].after[b].to_vector<float>()[i];
        if (got != expected)
          FAIL_CHECK("bucket " << b << " element " << i << " rank " << r << ": " << got << " != " << expected);
      }
      double exact = 0;
      for (float v : values) exact += v;
      inexact += double(expected) != exact / double(values.size());
    }
  CHECK(inexact > 0);  // the data do round: the reference is not the f32 average in disguise
}

}  // namespace

TEST_CASE("bf16_compress: each rank's bf16 gradients summed in f32, rounded to bf16, halved, rounded") {
  check_against(reduce_with(2, comm_hooks::bf16_compress), [](const std::vector<float>& g) {
    const float sum = bf16(float(double(bf16(g[0])) + double(bf16(g[1]))));  // the f32 add, then bf16
    return bf16(sum / 2.f);
  });
}

TEST_CASE("fp16_compress: gradients divided by the world size in f32, then f16, summed in f32, rounded to f16") {
  check_against(reduce_with(2, comm_hooks::fp16_compress), [](const std::vector<float>& g) {
    return f16(float(double(f16(g[0] * 0.5f)) + double(f16(g[1] * 0.5f))));
  });
}

TEST_CASE("bf16_single_rounding: the bf16 gradients of 3 ranks summed in f32 in rank order, divided, rounded once") {
  check_against(reduce_with(3, comm_hooks::bf16_single_rounding), [](const std::vector<float>& g) {
    float sum = bf16(g[0]);
    for (size_t r = 1; r < g.size(); ++r) sum += bf16(g[r]);
    return bf16(sum / 3.f);
  });
}

TEST_CASE("comm hooks by name: the built-ins, and an unknown name listed against them") {
  CHECK(comm_hooks::names() ==
        std::vector<std::string>{"allreduce", "bf16_compress", "fp16_compress", "bf16_single_rounding"});
  using Hook = CommHookFuture (*)(comm::ProcessGroup&, GradBucket&);
  const std::vector<Hook> expected{comm_hooks::allreduce, comm_hooks::bf16_compress, comm_hooks::fp16_compress,
                                   comm_hooks::bf16_single_rounding};
  for (size_t i = 0; i < expected.size(); ++i) {
    const CommHook hook = comm_hooks::by_name(comm_hooks::names()[i]);
    REQUIRE(hook.target<Hook>() != nullptr);
    CHECK_MESSAGE(bool(*hook.target<Hook>() == expected[i]), comm_hooks::names()[i]);  // each name is its own hook
  }
  CHECK_THROWS_WITH_AS(comm_hooks::by_name("powerSGD"),
                       doctest::Contains("unknown comm hook 'powerSGD'; hint: use one of allreduce, bf16_compress"),
                       Error);
}
