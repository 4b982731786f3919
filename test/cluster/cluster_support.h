// What the cluster tests share: simulated hosts (scripts/sim_cluster.sh), the built programs, the
// digits data, and the checks a multi-process run needs.
#pragma once

#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "test/comm/helpers/child_process.h"
#include "test/test_skip.h"
#include "test/test_support.h"

namespace tinyddp::testing {

inline std::string bin(const std::string& name) { return std::string(TINYDDP_BIN_DIR) + "/" + name; }
inline std::string source_file(const std::string& path) { return std::string(TINYDDP_SOURCE_DIR) + "/" + path; }

inline bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

inline size_t count_of(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// True when every program is built; otherwise says which is missing (the test then skips).
inline bool programs_built(std::initializer_list<const char*> names) {
  for (const char* name : names)
    if (!std::filesystem::exists(bin(name))) {
      TINYDDP_RECORD_SKIP(bin(name), " is not built (configure with examples and benchmarks on, and build it)");
      return false;
    }
  return true;
}

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// K simulated hosts, made by scripts/sim_cluster.sh and removed when this goes out of scope.
class SimCluster {
 public:
  // `tag`: a letter or two that tells this test's cluster from the others of the same process.
  SimCluster(int hosts, const std::string& tag) : hosts_(hosts) {
    name_ = tag + std::to_string(getpid() % 100000);
    auto why = finish_child(spawn_program({script(), "check"}), std::chrono::seconds(30));
    if (!why.ok()) {
      why_not_ = why.report.empty() ? why.describe() : why.report;
      return;
    }
    auto up = finish_child(spawn_program({script(), "up", name_, std::to_string(hosts)}), std::chrono::seconds(60));
    if (!up.ok()) {
      why_not_ = "sim_cluster.sh up failed: " + up.describe();
      return;
    }
    for (int i = 0; i < hosts; ++i) {
      auto addr = finish_child(spawn_program({script(), "addr", name_, std::to_string(i)}), std::chrono::seconds(10));
      addresses_.push_back(addr.report.substr(0, addr.report.find('\n')));
    }
    ready_ = true;
  }
  ~SimCluster() {
    if (ready_ || !addresses_.empty()) finish_child(spawn_program({script(), "down", name_}), std::chrono::seconds(60));
  }
  SimCluster(const SimCluster&) = delete;
  SimCluster& operator=(const SimCluster&) = delete;

  bool ready() const { return ready_; }
  const std::string& name() const { return name_; }  // host i's hostname is name()-i
  const std::string& why_not() const { return why_not_; }
  int hosts() const { return hosts_; }
  const std::string& address(int host) const { return addresses_.at(size_t(host)); }

  // Starts argv on host `host` (its network, hostname, /dev/shm and pid space), stdout and stderr captured.
  Child start(int host, std::vector<std::string> argv, const std::vector<std::string>& env = {}) const {
    argv.insert(argv.begin(), {script(), "run", name_, std::to_string(host)});
    return spawn_program(argv, env);
  }

  static std::string script() { return source_file("scripts/sim_cluster.sh"); }

 private:
  int hosts_;
  std::string name_, why_not_;
  std::vector<std::string> addresses_;
  bool ready_ = false;
};

// `tinyddp-run -n per_host --nnodes H --node-rank i --master-addr <host 0> --master-port 29500 program...`
// on every host at once; waits for all of them. Node 0's output first.
struct ClusterJob {
  std::vector<ChildOutcome> nodes;
  bool ok() const {
    for (const auto& n : nodes)
      if (!n.ok()) return false;
    return !nodes.empty();
  }
  std::string describe() const {
    std::string text;
    for (size_t i = 0; i < nodes.size(); ++i)
      text += "--- node " + std::to_string(i) + ": " + nodes[i].describe() + "\n";
    return text;
  }
};

inline ClusterJob run_on_cluster(const SimCluster& cluster, int per_host, const std::vector<std::string>& program,
                                 const std::vector<std::string>& launcher_flags = {},
                                 const std::vector<std::string>& env = {},
                                 std::chrono::seconds timeout = std::chrono::seconds(120)) {
  std::vector<Child> children;
  std::vector<std::string> environment = {"TINYDDP_TOKEN=cluster-test-token"};
  environment.insert(environment.end(), env.begin(), env.end());
  // The far nodes first: they wait for node 0's store to appear, as on a real cluster.
  for (int host = cluster.hosts() - 1; host >= 0; --host) {
    std::vector<std::string> argv = {bin("tinyddp-run"),
                                     "-n",
                                     std::to_string(per_host),
                                     "--nnodes",
                                     std::to_string(cluster.hosts()),
                                     "--node-rank",
                                     std::to_string(host),
                                     "--master-addr",
                                     cluster.address(0),
                                     "--master-port",
                                     "29500"};
    argv.insert(argv.end(), launcher_flags.begin(), launcher_flags.end());
    argv.insert(argv.end(), program.begin(), program.end());
    children.push_back(cluster.start(host, argv, environment));
  }
  ClusterJob job;
  job.nodes.resize(children.size());
  auto deadline = Clock::now() + timeout;
  for (size_t i = 0; i < children.size(); ++i) job.nodes[children.size() - 1 - i] = finish_child(children[i], deadline);
  return job;
}

}  // namespace tinyddp::testing
