// The all-reduce algorithms on 2 simulated hosts x 2 ranks (shared memory inside a host, tcp
// across; scripts/sim_cluster.sh): each forced with all_reduce_perf --algo, every result checked
// (#wrong 0), odd element counts included. The hierarchical algorithm runs here on the host layout
// it is made for, which one host cannot show. Skips with sim_cluster.sh's reason without root.
#include <doctest/doctest.h>

#include <utility>

#include "test/cluster/cluster_support.h"
#include "test/test_skip.h"
#include "test/test_support.h"

using namespace tinyddp::testing;

TEST_CASE("cluster: every all-reduce algorithm is exact on 2 hosts x 2 ranks") {
  if (!programs_built({"tinyddp-run", "all_reduce_perf"})) return;
  SimCluster cluster(2, "al");
  if (!cluster.ready()) {
    TINYDDP_SKIP("simulated hosts are not available here (", cluster.why_not(), ")");
  }
  // -R 2: the buffers in each host's symmetric memory, where the hierarchical algorithm's in-host phases
  // read the peers' parts in place (algorithms/symmetric_hierarchical_all_reduce.h).
  for (auto [algo, registration] : {std::pair{"hier", "0"}, std::pair{"hier", "2"}, std::pair{"rd", "0"},
                                    std::pair{"rabenseifner", "0"}, std::pair{"auto", "0"}}) {
    INFO("--algo ", algo, " -R ", registration);
    // 1 KiB + 4 bytes ... : odd counts (257, 2053, 16421 floats) as well as the usual ones.
    // auto chooses with the model the link probe measures (every rank must agree on it).
    ClusterJob job = run_on_cluster(cluster, 2,
                                    {bin("all_reduce_perf"), "-b", "1028", "-e", "70000", "-f", "8", "-n", "2", "-w",
                                     "1", "-o", "all", "--algo", algo, "-R", registration},
                                    {}, {"TINYDDP_COST_MODEL=probe"});
    REQUIRE_MESSAGE(job.ok(), job.describe(), job.nodes[0].report);
    CHECK_MESSAGE(contains(job.nodes[0].report, "# Out of bounds values : 0 OK"), job.nodes[0].report);
  }
}

TEST_CASE("cluster: the hierarchical all-gather and the host-ordered broadcast are exact on 2 hosts x 2 ranks") {
  if (!programs_built({"tinyddp-run", "all_gather_perf", "broadcast_perf"})) return;
  SimCluster cluster(2, "ag");
  if (!cluster.ready()) {
    TINYDDP_SKIP("simulated hosts are not available here (", cluster.why_not(), ")");
  }
  // Every root for the broadcast; odd counts for both. Rank order is host-major here, so the
  // broadcast's chain is the flat one; test_hierarchical_gather.cpp covers round-robin placement.
  for (std::vector<std::string> perf : {std::vector<std::string>{"all_gather_perf"}, {"broadcast_perf", "-r", "all"}}) {
    INFO(perf[0]);
    std::vector<std::string> command = {bin(perf[0]), "-b", "1028", "-e", "70000", "-f", "8", "-n", "2", "-w", "1"};
    command.insert(command.end(), perf.begin() + 1, perf.end());
    ClusterJob job = run_on_cluster(cluster, 2, command);
    REQUIRE_MESSAGE(job.ok(), job.describe(), job.nodes[0].report);
    CHECK_MESSAGE(contains(job.nodes[0].report, "# Out of bounds values : 0 OK"), job.nodes[0].report);
  }
}
