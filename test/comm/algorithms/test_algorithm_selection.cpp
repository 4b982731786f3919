// The cost model's traffic counts against the closed forms the algorithm files state, its file
// format, and what the selector picks where the answer is not in doubt.
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "tinyddp/comm/algorithms/algorithm_selection.h"
#include "tinyddp/comm/algorithms/cost_model.h"
#include "tinyddp/comm/process_group.h"
#include "test/comm/test_collectives_support.h"

using namespace tinyddp;
using namespace tinyddp::comm;

TEST_CASE("the cost model counts each algorithm's steps and bytes as their closed forms say") {
  const double S = 1 << 20;
  for (int n : {2, 3, 4, 5, 7, 8, 64}) {
    CAPTURE(n);
    const HostLayout flat = HostLayout::uniform(n, 1);  // one rank per host: every byte crosses
    const int p = 1 << int(std::floor(std::log2(n))), log_p = int(std::log2(p)), extra_steps = n > p ? 2 : 0;
    Traffic ring = all_reduce_traffic(AllReduceAlgorithm::ring, flat, S);
    CHECK(ring.network_steps == 2 * (n - 1));
    CHECK(ring.max_host_egress() == doctest::Approx(2.0 * (n - 1) / n * S));
    Traffic rd = all_reduce_traffic(AllReduceAlgorithm::recursive_doubling, flat, S);
    CHECK(rd.network_steps == log_p + extra_steps);
    CHECK(rd.max_host_egress() == doctest::Approx(log_p * S + (n > p ? S : 0)));
    Traffic rab = all_reduce_traffic(AllReduceAlgorithm::rabenseifner, flat, S);
    CHECK(rab.network_steps == 2 * log_p + extra_steps);
    // A core rank sends 2(p-1)/p·S; the folded pairs' odd rank also sends the result back.
    CHECK(rab.max_host_egress() == doctest::Approx(2.0 * (p - 1) / p * S + (n > p ? S : 0)));
    CHECK(rab.total_cross_host_bytes() == doctest::Approx(p * 2.0 * (p - 1) / p * S + 2 * (n - p) * S));
    Traffic direct = all_reduce_traffic(AllReduceAlgorithm::direct, flat, S);
    CHECK(direct.network_steps == 1);
    CHECK(direct.max_host_egress() == doctest::Approx((n - 1) * S));
    // α is paid per message: one a step for all but the direct exchange, whose one step sends n-1.
    CHECK(direct.network_messages == n - 1);
    CHECK(ring.network_messages == ring.network_steps);
    CHECK(rd.network_messages == rd.network_steps);
    CHECK(rab.network_messages == rab.network_steps);
  }
}

TEST_CASE("on 2 hosts x 2 ranks the hierarchical algorithm sends S per host across, the flat ring 1.5 S") {
  const double S = 1 << 20;
  const HostLayout two_by_two = HostLayout::uniform(2, 2);
  Traffic ring = all_reduce_traffic(AllReduceAlgorithm::ring, two_by_two, S);
  Traffic hier = all_reduce_traffic(AllReduceAlgorithm::hierarchical, two_by_two, S);
  CHECK(ring.max_host_egress() == doctest::Approx(1.5 * S));
  CHECK(hier.max_host_egress() == doctest::Approx(S));
  CHECK(hier.network_steps == 2);  // the cross-host ring between 2 hosts
  CHECK(hier.in_host_steps == 2);  // reduce-scatter and all-gather between 2 ranks
  // 4 hosts x 4 ranks: 2(H-1)/H·S per host across.
  Traffic hier16 = all_reduce_traffic(AllReduceAlgorithm::hierarchical, HostLayout::uniform(4, 4), S);
  CHECK(hier16.max_host_egress() == doctest::Approx(1.5 * S));
  CHECK(all_reduce_traffic(AllReduceAlgorithm::ring, HostLayout::uniform(4, 4), S).max_host_egress() ==
        doctest::Approx(2.0 * 15 / 16 * S));
}

TEST_CASE("the selector: today's size crossover on one host; the model across hosts") {
  CostModel gigabit = CostModel::parse("alpha_network_us 50\nnetwork_gbit_per_s 1 # shaped\n", "test");
  CHECK(gigabit.network_bytes_per_s == doctest::Approx(1.25e8));
  AllReduceSelector one_host(AllReduceAlgorithm::automatic, gigabit, HostLayout::uniform(1, 4), 32 << 10);
  CHECK(one_host.choose(4 << 10) == AllReduceAlgorithm::direct);
  CHECK(one_host.choose(1 << 20) == AllReduceAlgorithm::ring);
  AllReduceSelector four_hosts(AllReduceAlgorithm::automatic, gigabit, HostLayout::uniform(4, 1), 32 << 10);
  const AllReduceAlgorithm small = four_hosts.choose(1 << 10);
  CHECK((small == AllReduceAlgorithm::recursive_doubling || small == AllReduceAlgorithm::direct));
  const AllReduceAlgorithm large = four_hosts.choose(64 << 20);
  CHECK((large == AllReduceAlgorithm::ring || large == AllReduceAlgorithm::rabenseifner));
  AllReduceSelector two_by_two(AllReduceAlgorithm::automatic, gigabit, HostLayout::uniform(2, 2), 32 << 10);
  CHECK(two_by_two.choose(16 << 20) == AllReduceAlgorithm::hierarchical);
  AllReduceSelector forced(AllReduceAlgorithm::rabenseifner, gigabit, HostLayout::uniform(2, 2), 32 << 10);
  CHECK(forced.choose(1) == AllReduceAlgorithm::rabenseifner);
}

TEST_CASE("the direct exchange pays α for each of its n-1 messages, so many ranks take rd for small messages") {
  // The model the probe measured on 8 simulated hosts at 1 Gbit/s (docs/cluster-network.md).
  const CostModel probed =
      CostModel::parse("alpha_network_us 145.8\nnetwork_gbit_per_s 0.914\nreduce_gbyte_per_s 13.6\n", "test");
  const HostLayout eight = HostLayout::uniform(8, 1);
  const double direct = predicted_seconds(probed, all_reduce_traffic(AllReduceAlgorithm::direct, eight, 1024));
  const double rd = predicted_seconds(probed, all_reduce_traffic(AllReduceAlgorithm::recursive_doubling, eight, 1024));
  CHECK(direct == doctest::Approx(probed.call_s + 7 * 145.8e-6 + 7 * 1024 / (0.914e9 / 8) + 7 * 1024 / 13.6e9));
  CHECK(rd < direct);
  AllReduceSelector selector(AllReduceAlgorithm::automatic, probed, eight, 32 << 10);
  CHECK(selector.choose(1024) == AllReduceAlgorithm::recursive_doubling);
  // Two ranks: one message either way, and the direct exchange stays the cheapest.
  AllReduceSelector pair(AllReduceAlgorithm::automatic, probed, HostLayout::uniform(2, 1), 32 << 10);
  CHECK(pair.choose(1024) == AllReduceAlgorithm::direct);
}

TEST_CASE("the per-call term: parsed, added once to every prediction, and no choice of auto moves with it") {
  CHECK(CostModel{}.call_s == doctest::Approx(2e-6));
  const std::string link =
      "alpha_network_us 100\nnetwork_gbit_per_s 1\nalpha_in_host_us 10\nin_host_gbyte_per_s 2\nreduce_gbyte_per_s 4\n";
  const CostModel none = CostModel::parse(link + "call_us 0\n", "test");
  const CostModel slow = CostModel::parse(link + "call_us 150\n", "test");
  CHECK(none.call_s == 0);
  CHECK(slow.call_s == doctest::Approx(150e-6));
  CHECK(CostModel::parse(slow.to_text(), "round trip").call_s == doctest::Approx(150e-6));
  // Closed form, 4 hosts x 1 rank, rd on S bytes: 2 steps of one message each, 2·S out of each
  // host, 2·S reduced.
  const double S = 4096;
  const Traffic rd = all_reduce_traffic(AllReduceAlgorithm::recursive_doubling, HostLayout::uniform(4, 1), S);
  CHECK(predicted_seconds(slow, rd) == doctest::Approx(150e-6 + 2 * 100e-6 + 2 * S / 1.25e8 + 2 * S / 4e9));
  CHECK(predicted_seconds(slow, rd) - predicted_seconds(none, rd) == doctest::Approx(150e-6));
  CHECK(transfer_seconds(slow, rd) == doctest::Approx(predicted_seconds(none, rd)));
  // 2 x 2, hier with its cross-host ring: 2 in-host steps and 2 network steps; S sent in host by
  // each rank, S out of each host, S/2 + S/4 reduced.
  const Traffic hier = all_reduce_traffic(AllReduceAlgorithm::hierarchical, HostLayout::uniform(2, 2), S);
  CHECK(predicted_seconds(slow, hier) ==
        doctest::Approx(150e-6 + 2 * 100e-6 + 2 * 10e-6 + S / 1.25e8 + S / 2e9 + (S / 2 + S / 4) / 4e9));
  // A constant per call cannot change which algorithm is fastest, so auto chooses the same at every
  // size; a per-call cost of 10 s makes any use of it inside the ring's relative margin show.
  const CostModel huge = CostModel::parse(link + "call_us 1e7\n", "test");
  for (auto [hosts, per_host] : {std::pair{4, 1}, {2, 2}, {8, 1}, {4, 2}, {3, 1}, {16, 4}}) {
    const HostLayout layout = HostLayout::uniform(hosts, per_host);
    const AllReduceSelector a(AllReduceAlgorithm::automatic, none, layout, 32 << 10);
    const AllReduceSelector b(AllReduceAlgorithm::automatic, slow, layout, 32 << 10);
    const AllReduceSelector c(AllReduceAlgorithm::automatic, huge, layout, 32 << 10);
    for (size_t bytes = 4; bytes <= (size_t(256) << 20); bytes *= 2) {
      CAPTURE(hosts);
      CAPTURE(per_host);
      CAPTURE(bytes);
      CHECK(a.choose(bytes) == b.choose(bytes));
      CHECK(a.choose_across_hosts(bytes) == b.choose_across_hosts(bytes));
      CHECK(a.choose(bytes) == c.choose(bytes));
      CHECK(a.choose_across_hosts(bytes) == c.choose_across_hosts(bytes));
    }
  }
  CHECK_THROWS_WITH(CostModel::parse("call_us -1\n", "f"), doctest::Contains("not a non-negative number"));
  CHECK_THROWS_WITH(CostModel::parse("alpha_network_us 0\n", "f"), doctest::Contains("not a positive number"));
}

TEST_CASE("bad algorithm names and cost model files are refused, naming what is wrong") {
  CHECK_THROWS_WITH(algorithm_from_name("tree", "TINYDDP_ALGO"),
                    doctest::Contains("auto|ring|direct|rd|rabenseifner|hier"));
  CHECK_THROWS_WITH(CostModel::parse("alpha_network_us 30\nbandwidth 3\n", "f"),
                    doctest::Contains("line 2: unknown key 'bandwidth'"));
  CHECK_THROWS_WITH(CostModel::parse("network_gbit_per_s -1\n", "f"), doctest::Contains("not a positive number"));
  CHECK_THROWS_WITH(CostModel::parse("network_gbit_per_s\n", "f"), doctest::Contains("needs exactly one value"));
  CostModel m = CostModel::parse("network_gbit_per_s 5\nreduce_gbyte_per_s 3", "f");
  CostModel back = CostModel::parse(m.to_text(), "round trip");
  CHECK(back.network_bytes_per_s == doctest::Approx(m.network_bytes_per_s));
  CHECK(back.reduce_bytes_per_s == doctest::Approx(3e9));

  ProcessGroupOptions options;
  options.algorithm = "butterfly";
  options.group_name = "bad-algo";
  CHECK_THROWS_WITH(tinyddp::testing::make_groups(1, options),
                    doctest::Contains("unknown all-reduce algorithm 'butterfly'"));
}

TEST_CASE("ProcessGroupOptions::algorithm reaches the all-reduce: each forced algorithm is exact through the group") {
  for (std::string algo : {"ring", "direct", "rd", "rabenseifner", "hier", "auto"}) {
    for (int world : {3, 4}) {
      CAPTURE(algo);
      CAPTURE(world);
      ProcessGroupOptions options;
      options.algorithm = algo;
      options.group_name = "forced-" + algo + std::to_string(world);
      options.timeout = std::chrono::seconds(20);
      auto groups = tinyddp::testing::make_groups(world, options);
      const int64_t count = 100'003;
      std::vector<std::vector<float>> results(static_cast<size_t>(world));
      tinyddp::testing::run_ranks(world, [&](int r) {
        Tensor t = tinyddp::testing::make_input<float>(ReduceOp::sum, r, count);
        groups[size_t(r)]->all_reduce(t)->wait();
        results[size_t(r)].assign(t.data<float>(), t.data<float>() + count);
      });
      const auto expected = tinyddp::testing::reference_reduce<float>(ReduceOp::sum, world, count);
      for (int r = 0; r < world; ++r) CHECK(results[size_t(r)] == expected);
    }
  }
}
