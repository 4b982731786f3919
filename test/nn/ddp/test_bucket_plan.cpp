// The bucket plan (nn/ddp/bucket_plan.h): sizes and orders derived by hand for the examples' models, and
// PyTorch's own assignment (torch.distributed._compute_bucket_assignment_by_size, fed the same order;
// test/fixtures/make_ddp.py -> ddp_buckets.safetensors) for every case in the fixture.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "tinyddp/core/random.h"
#include "tinyddp/core/safetensors.h"
#include "tinyddp/nn/activations.h"
#include "tinyddp/nn/ddp/bucket_plan.h"
#include "tinyddp/nn/linear.h"
#include "tinyddp/nn/sequential.h"
#include "test/test_support.h"

using namespace tinyddp;
using namespace tinyddp::nn;
using Indices = std::vector<size_t>;

namespace {

constexpr size_t MiB = size_t(1) << 20;

// Gradient bytes of an MLP's parameters in registration order, from a real model (not by formula).
std::vector<size_t> mlp_parameter_bytes(const std::vector<int64_t>& widths) {
  Generator gen(0);
  Sequential model;
  for (size_t i = 0; i + 1 < widths.size(); ++i) {
    model.emplace<Linear>(widths[i], widths[i + 1], gen);
    if (i + 2 < widths.size()) model.emplace<ReLU>();
  }
  std::vector<size_t> bytes;
  for (Parameter* p : model.parameters()) bytes.push_back(p->value.nbytes());
  return bytes;
}

std::vector<Indices> parameter_lists(const std::vector<BucketSpec>& buckets) {
  std::vector<Indices> out;
  for (const BucketSpec& b : buckets) out.push_back(b.parameters);
  return out;
}

}  // namespace

TEST_CASE("the bench MLP 784-1024-1024-10: a first bucket that closes at 1 MiB, then everything else") {
  // Registration order: 0.weight 3211264 B, 0.bias 4096, 2.weight 4194304, 2.bias 4096, 4.weight 40960, 4.bias 40.
  std::vector<size_t> bytes = mlp_parameter_bytes({784, 1024, 1024, 10});
  REQUIRE(bytes == std::vector<size_t>{3211264, 4096, 4194304, 4096, 40960, 40});
  // Reverse order: 40 + 40960 + 4096 = 45096 B stays under 1 MiB; 2.weight takes it to 4239400 B, which
  // closes bucket 0. The rest, 4096 + 3211264 = 3215360 B, stays under 25 MiB: bucket 1.
  auto buckets = plan_buckets(reverse_registration_order(bytes.size()), bytes);
  REQUIRE(buckets.size() == 2);
  CHECK(buckets[0].parameters == Indices{5, 4, 3, 2});
  CHECK(buckets[0].bytes == 4239400);
  CHECK(buckets[0].size_limit == MiB);
  CHECK(buckets[1].parameters == Indices{1, 0});
  CHECK(buckets[1].bytes == 3215360);
  CHECK(buckets[1].size_limit == 25 * MiB);

  // A ready order with each weight before its bias (not what Linear produces: it follows PyTorch's
  // autograd, bias first, which is reverse registration order) would regroup them:
  // 4.weight + 4.bias + 2.weight = 4235304 B closes bucket 0; 2.bias + 0.weight + 0.bias = 3219456 B.
  auto rebuilt = plan_buckets(Indices{4, 5, 2, 3, 0, 1}, bytes);
  CHECK(parameter_lists(rebuilt) == std::vector<Indices>{{4, 5, 2}, {3, 0, 1}});
  CHECK(rebuilt[0].bytes == 4235304);
  CHECK(rebuilt[1].bytes == 3219456);
}

TEST_CASE("small models fit in one bucket: the seed's Linear(10, 2) and the digits MLP") {
  auto dummy = plan_buckets(reverse_registration_order(2), mlp_parameter_bytes({10, 2}));
  REQUIRE(dummy.size() == 1);
  CHECK(dummy[0].parameters == Indices{1, 0});
  CHECK(dummy[0].bytes == 88);  // 2*10*4 + 2*4

  auto digits = plan_buckets(reverse_registration_order(4), mlp_parameter_bytes({64, 128, 10}));
  REQUIRE(digits.size() == 1);
  CHECK(digits[0].parameters == Indices{3, 2, 1, 0});
  CHECK(digits[0].bytes == (64 * 128 + 128 + 128 * 10 + 10) * 4);
}

TEST_CASE("limits: reaching one exactly closes the bucket; a parameter over the cap gets a bucket of its own") {
  // Exactly 1 MiB: closed at once, and the next bucket uses the cap.
  auto exact = plan_buckets(Indices{0, 1}, std::vector<size_t>{MiB, 10});
  CHECK(parameter_lists(exact) == std::vector<Indices>{{0}, {1}});
  CHECK(exact[1].size_limit == 25 * MiB);

  // Reverse order 2 (2 MiB: closes the 1 MiB bucket alone), 1 (30 MiB: over the 25 MiB cap, alone), 0.
  auto big = plan_buckets(reverse_registration_order(3), std::vector<size_t>{8, 30 * MiB, 2 * MiB});
  CHECK(parameter_lists(big) == std::vector<Indices>{{2}, {1}, {0}});
  CHECK(big[1].bytes == 30 * MiB);

  // Custom limits: first 100 B, cap 250 B over ten 60-byte parameters: 2 in the first bucket (120 B),
  // then 5 per bucket (300 B >= 250 B), then the remaining 3.
  auto custom = plan_buckets(reverse_registration_order(10), std::vector<size_t>(10, 60), 100, 250);
  CHECK(parameter_lists(custom) == std::vector<Indices>{{9, 8}, {7, 6, 5, 4, 3}, {2, 1, 0}});

  CHECK(plan_buckets(Indices{}, std::vector<size_t>{}).empty());
}

TEST_CASE("plan_buckets refuses orders that are not permutations, and zero limits") {
  std::vector<size_t> bytes{4, 4, 4};
  CHECK_THROWS_WITH(plan_buckets(Indices{0, 1}, bytes), doctest::Contains("lists 2 parameters but there are 3"));
  CHECK_THROWS_WITH(plan_buckets(Indices{0, 1, 1}, bytes), doctest::Contains("appears twice"));
  CHECK_THROWS_WITH(plan_buckets(Indices{0, 1, 3}, bytes), doctest::Contains("out of range"));
  CHECK_THROWS_WITH(plan_buckets(Indices{0, 1, 2}, bytes, 0, 10), doctest::Contains("hint:"));
  CHECK_THROWS_WITH(plan_buckets(Indices{0, 1, 2}, bytes, 10, 0), doctest::Contains("must be positive"));
}

TEST_CASE("describe_buckets lists each bucket's bytes and parameter names") {
  std::vector<size_t> bytes = mlp_parameter_bytes({784, 1024, 1024, 10});
  auto buckets = plan_buckets(reverse_registration_order(bytes.size()), bytes);
  std::string text = describe_buckets(buckets, {"0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"});
  CHECK(text ==
        "bucket 0: 4.0 MiB (4239400 bytes, limit 1.0 MiB): 4.bias, 4.weight, 2.bias, 2.weight\n"
        "bucket 1: 3.1 MiB (3215360 bytes, limit 25.0 MiB): 0.bias, 0.weight\n");
}

TEST_CASE("every case of PyTorch's _compute_bucket_assignment_by_size is reproduced") {
  SafetensorsFile file = load_safetensors(tinyddp::testing::fixture("ddp_buckets.safetensors"));
  auto cases = nlohmann::json::parse(file.metadata.at("cases"));
  REQUIRE(cases.size() >= 5);
  for (const auto& c : cases) {
    CAPTURE(c["label"].get<std::string>());
    std::vector<size_t> bytes = mlp_parameter_bytes(c["widths"].get<std::vector<int64_t>>());
    CHECK(bytes == c["parameter_bytes"].get<std::vector<size_t>>());
    auto buckets = plan_buckets(reverse_registration_order(bytes.size()), bytes, c["first_bucket_bytes"].get<size_t>(),
                                c["bucket_cap_bytes"].get<size_t>());
    CHECK(parameter_lists(buckets) == c["buckets"].get<std::vector<Indices>>());
    std::vector<size_t> limits;
    for (const BucketSpec& b : buckets) limits.push_back(b.size_limit);
    CHECK(limits == c["limits"].get<std::vector<size_t>>());
  }
}
