// Symmetric memory and the cross-memory path inside a simulated host (scripts/sim_cluster.sh): its own
// /dev/shm, pid space and hostname, as a container on a real cluster node has. The ranks must find
// each other's parts (/proc/<pid>/fd of a pid in that space), reduce exactly, and leave that host's
// /dev/shm as they found it.
#include "test/cluster/cluster_support.h"

using namespace tinyddp;
using namespace tinyddp::testing;

TEST_CASE(
    "cluster: symmetric buffers (-R 2) and ordinary ones inside one simulated host leave its /dev/shm as they found "
    "it") {
  if (!programs_built({"tinyddp-run", "all_reduce_perf"})) return;
  SimCluster cluster(1, "cy");
  if (!cluster.ready()) {
    TINYDDP_RECORD_SKIP("simulated hosts are not available here (", cluster.why_not(), ")");
    return;
  }
  auto shm_entries = [&] {
    auto listing = finish_child(cluster.start(0, {"sh", "-c", "ls -A /dev/shm"}), std::chrono::seconds(20));
    REQUIRE_MESSAGE(listing.ok(), listing.describe());
    return listing.report;
  };
  const std::string before = shm_entries();
  for (const char* registration : {"2", "0"}) {
    INFO("-R ", registration);
    ClusterJob job = run_on_cluster(cluster, 3,
                                    {bin("all_reduce_perf"), "-b", "1K", "-e", "4M", "-f", "16", "-n", "3", "-w", "1",
                                     "-R", registration, "--transport", "shm"});
    REQUIRE_MESSAGE(job.ok(), job.describe(), job.nodes[0].report);
    CHECK_MESSAGE(contains(job.nodes[0].report, "# Out of bounds values : 0 OK"), job.nodes[0].report);
    CHECK(count_of(job.nodes[0].report, "float     sum") == 4);  // 1K, 16K, 256K, 4M
  }
  CHECK(shm_entries() == before);
}
