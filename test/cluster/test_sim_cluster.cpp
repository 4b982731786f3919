// Multi-host jobs on simulated hosts (scripts/sim_cluster.sh: each host its own network namespace,
// hostname, /dev/shm and pid space, on one bridge), two layouts, 2 hosts x 2 ranks and 3 hosts x 1
// rank, each started as a user would on a real cluster, `tinyddp-run --nnodes H --node-rank i
// --master-addr <host 0>` on every host:
//   - all_reduce_perf over --transport auto (shared memory inside a host, tcp across) and tcp, every
//     result checked (#wrong 0);
//   - digits for two epochs: the loss history and the weights agree with the same job on one host;
//   - a worker SIGKILLed in the middle of a step, with --max-restarts 1: the launchers name it,
//     restart the group, and the job ends with exactly the weights of a run never killed.
// Needs root (namespaces); skips with sim_cluster.sh's reason otherwise.
#include <doctest/doctest.h>

#include <iterator>
#include <memory>
#include <regex>

#include "tinyddp/core/safetensors.h"
#include "test/cluster/cluster_support.h"
#include "test/test_skip.h"
#include "test/test_support.h"

using namespace tinyddp;
using namespace tinyddp::testing;
using namespace std::chrono_literals;

namespace {

struct Layout {
  int hosts, per_host;
  const char* tag;
};
constexpr Layout kLayouts[] = {{2, 2, "ca"}, {3, 1, "cb"}};

// How many times `pattern` (an ECMAScript regex) matches in `text`.
size_t count_matches(const std::string& text, const std::string& pattern) {
  const std::regex re(pattern);
  return size_t(std::distance(std::sregex_iterator(text.begin(), text.end(), re), std::sregex_iterator()));
}

std::string layout_name(const Layout& l) {
  return std::to_string(l.hosts) + " hosts x " + std::to_string(l.per_host) + " rank" + (l.per_host > 1 ? "s" : "");
}

void check_allreduce(const SimCluster& cluster, const Layout& layout, const std::string& transport) {
  INFO(layout_name(layout), ", --transport ", transport);
  ClusterJob job = run_on_cluster(cluster, layout.per_host,
                                  {bin("all_reduce_perf"), "-b", "64K", "-e", "4M", "-f", "8", "-n", "3", "-w", "1",
                                   "--transport", transport});
  REQUIRE_MESSAGE(job.ok(), job.describe(), job.nodes[0].report);
  const std::string& out = job.nodes[0].report;
  const int world = layout.hosts * layout.per_host;
  CHECK(contains(out, "world " + std::to_string(world)));
  // Every rank says where it runs ("Rank 2 Group 0 Pid 41 on <hostname> device ..."): per_host of them on
  // each host's own hostname.
  for (int host = 0; host < layout.hosts; ++host)
    CHECK(count_matches(out, " on +" + cluster.name() + "-" + std::to_string(host) + " device") ==
          size_t(layout.per_host));
  CHECK_MESSAGE(contains(out, "# Out of bounds values : 0 OK"), out);
  CHECK(count_matches(out, "float +sum") == 3);  // 64K, 512K, 4M
}

// The cluster for `layout`, or nullptr, having said why, where simulated hosts cannot be made.
std::unique_ptr<SimCluster> make_cluster(const Layout& layout) {
  auto cluster = std::make_unique<SimCluster>(layout.hosts, layout.tag);
  if (cluster->ready()) return cluster;
  TINYDDP_RECORD_SKIP("simulated hosts are not available here (", cluster->why_not(), ")");
  return nullptr;
}

}  // namespace

TEST_CASE("cluster: all_reduce_perf across simulated hosts, over transport auto and tcp") {
  if (!programs_built({"tinyddp-run", "all_reduce_perf"})) return;
  for (const Layout& layout : kLayouts) {
    auto made = make_cluster(layout);
    if (!made) return;
    const SimCluster& cluster = *made;
    check_allreduce(cluster, layout, "auto");
    check_allreduce(cluster, layout, "tcp");
  }
}

TEST_CASE("cluster: digits for two epochs across simulated hosts ends where the same job on one host ends") {
  if (!programs_built({"tinyddp-run", "digits"})) return;
  std::string data = digits_data();
  if (data.empty()) {
    TINYDDP_SKIP("no digits.csv.gz in ../shared/data or data/ (make data extracts it)");
  }
  for (const Layout& layout : kLayouts) {
    INFO(layout_name(layout));
    auto made = make_cluster(layout);
    if (!made) return;
    const SimCluster& cluster = *made;
    TempDir dir;
    const int world = layout.hosts * layout.per_host;
    std::vector<std::string> program = {bin("digits"), "--data", data, "--device", "cpu", "--epochs", "2"};
    auto with_save = [&](const std::string& file) {
      auto argv = program;
      argv.insert(argv.end(), {"--save", dir.file(file)});
      return argv;
    };
    ClusterJob job = run_on_cluster(cluster, layout.per_host, with_save("cluster.safetensors"));
    REQUIRE_MESSAGE(job.ok(), job.describe(), job.nodes[0].report);
    // The reference: the same world size on this one host.
    auto argv = with_save("one_host.safetensors");
    argv.insert(argv.begin(), {bin("tinyddp-run"), "-n", std::to_string(world)});
    ChildOutcome one_host = finish_child(spawn_program(argv, {"TINYDDP_TOKEN="}), 120s);
    REQUIRE_MESSAGE(one_host.ok(), one_host.report);

    const std::string& out = job.nodes[0].report;
    CHECK(contains(out, std::to_string(world) + " CPU workers, 2 epochs"));
    CHECK(count_of(out, "saved ") == 1);  // rank 0 only
    // The same data, order and arithmetic: the same weights, up to the order in which the two
    // all-reduces added the ranks' gradients (shared memory here, tcp across hosts there).
    SafetensorsFile a = load_safetensors(dir.file("cluster.safetensors"));
    SafetensorsFile b = load_safetensors(dir.file("one_host.safetensors"));
    for (const char* name : {"0.weight", "0.bias", "2.weight", "2.bias"})
      check_close(a.get(name), b.get(name), 1e-4, 1e-3,
                  std::string(name) + " after 2 epochs, across hosts vs one host");
    double accuracy = std::stod(out.substr(out.find("test accuracy ") + 14));
    double reference = std::stod(one_host.report.substr(one_host.report.find("test accuracy ") + 14));
    CHECK(accuracy == doctest::Approx(reference).epsilon(0.01));
    CHECK(accuracy > 0.8);
  }
}

TEST_CASE(
    "cluster: a worker SIGKILLed mid-step on another host; --max-restarts 1 restarts and ends bitwise as if never "
    "killed") {
  if (!programs_built({"tinyddp-run", "dummy_mgpu"})) return;
  for (const Layout& layout : kLayouts) {
    INFO(layout_name(layout));
    auto made = make_cluster(layout);
    if (!made) return;
    const SimCluster& cluster = *made;
    TempDir dir;
    const int world = layout.hosts * layout.per_host;
    const int victim = world - 1;  // on the last host, not node 0's
    auto program = [&](const std::string& save, const std::string& checkpoints) {
      return std::vector<std::string>{
          bin("dummy_mgpu"),  "--device",           "cpu", "--epochs", "3", "--save", dir.file(save),
          "--checkpoint-dir", dir.file(checkpoints)};
    };
    ClusterJob straight = run_on_cluster(cluster, layout.per_host, program("straight.safetensors", "ck-straight"));
    REQUIRE_MESSAGE(straight.ok(), straight.describe(), straight.nodes[0].report);

    ClusterJob killed = run_on_cluster(cluster, layout.per_host, program("killed.safetensors", "ck-killed"),
                                       {"--max-restarts", "1", "--grace-ms", "3000"},
                                       {"TINYDDP_FAULT=backward:10:" + std::to_string(victim)});
    REQUIRE_MESSAGE(killed.ok(), killed.describe(), killed.nodes[0].report, killed.nodes.back().report);
    const std::string& last_node = killed.nodes.back().report;
    CHECK(contains(last_node, "SIGKILL at backward (rank " + std::to_string(victim)));
    // Every node's launcher names the killed worker as the reason for the restart.
    const std::string named = "worker rank " + std::to_string(victim) + " (local rank " +
                              std::to_string(layout.per_host - 1) + " on node " + std::to_string(layout.hosts - 1);
    for (const auto& node : killed.nodes) {
      bool says_who = contains(node.report, named);
      bool says_restart = contains(node.report, "was killed by SIGKILL; stopped the group; restart 1 of 1");
      CHECK_MESSAGE(says_who, node.report);
      CHECK_MESSAGE(says_restart, node.report);
    }
    CHECK(contains(killed.nodes[0].report, "finished successfully (after 1 restart)"));
    CHECK(slurp(dir.file("killed.safetensors")) == slurp(dir.file("straight.safetensors")));
  }
}
