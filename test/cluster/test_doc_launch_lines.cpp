// Every launcher line of README.md and docs/launchers.md, run exactly as written: the lines are read
// from the pages themselves, so the pages cannot drift from what works. A line runs from a directory
// laid out like the repository root (build/bin, data) with the built programs on PATH, as after
// `cmake --install`, and with none of the caller's MASTER_ADDR, MASTER_PORT or TINYDDP_* variables:
// what a program needs must come from the launcher. It must exit 0 and its programs must say they
// finished.
//   - one host: tinyddp-run, torchrun, mpirun, as they are;
//   - several hosts (a line that names node0/node1, --nnodes, srun -N, --hostfile): on simulated
//     hosts (scripts/sim_cluster.sh; each its own network, hostname, /dev/shm and pid space) whose
//     /etc/hosts names them node0 and node1. A line said to run "on nodeK" runs there, at the same
//     time as its sibling lines; another runs on every host (torchrun --nnodes) or on node0 (mpirun
//     and srun, which reach the other hosts themselves: mpirun through its plm_rsh_agent,
//     bench/cluster_mpi_agent.sh, where it would use ssh, from host 0's network but this machine's
//     pid space, in which the agent finds the hosts; srun through a Slurm with a slurmd on each host,
//     scripts/slurm_localhost.sh --sim).
// An `export` line of the same block is run once and its value given to every host (the pages say
// "the same on every host"); a `<placeholder>` is replaced by what a reader would write (node0).
// A launcher that is not installed, and simulated hosts where they cannot be made, skip the lines
// that need them, saying so.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>

#include "test/cluster/cluster_support.h"
#include "test/test_skip.h"
#include "test/test_support.h"

using namespace tinyddp;
using namespace tinyddp::testing;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

struct DocLine {
  std::string page;  // README.md, docs/launchers.md
  int line = 0;
  int block = 0;                     // which ``` block of the page
  std::string command;               // as written, without its comment
  std::string comment;               // after "#", trimmed
  std::string launcher;              // tinyddp-run, torchrun, srun, mpirun
  std::vector<std::string> exports;  // the block's `export NAME=...` lines before it

  std::string where() const { return page + ":" + std::to_string(line) + ": " + command; }
  bool names(const std::string& word) const { return command.find(word) != std::string::npos; }
};

std::string trim(const std::string& text) {
  const size_t first = text.find_first_not_of(" \t");
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(" \t") - first + 1);
}

// The launcher a command line starts with, or "" for any other line.
std::string launcher_of(const std::string& command) {
  std::istringstream words(command);
  std::string first;
  words >> first;
  const std::string name = first.substr(first.rfind('/') + 1);
  for (const char* launcher : {"tinyddp-run", "torchrun", "srun", "mpirun"})
    if (name == launcher) return launcher;
  return "";
}

std::vector<DocLine> launcher_lines(const std::string& page) {
  std::ifstream in(source_file(page));
  REQUIRE_MESSAGE(in, "cannot read ", source_file(page));
  std::vector<DocLine> lines;
  std::vector<std::string> exports;
  bool in_block = false;
  int number = 0, block = 0;
  for (std::string text; std::getline(in, text);) {
    ++number;
    if (text.rfind("```", 0) == 0) {
      in_block = !in_block;
      if (in_block) ++block, exports.clear();
      continue;
    }
    if (!in_block) continue;
    // A comment starts at " #" (a '#' inside a word, as in a URL fragment, is not one).
    const size_t hash = text.find(" #");
    DocLine line;
    line.page = page;
    line.line = number;
    line.block = block;
    line.command = trim(text.substr(0, hash));
    line.comment = hash == std::string::npos ? "" : trim(text.substr(hash + 2));
    if (line.command.rfind("export ", 0) == 0) exports.push_back(line.command);
    line.launcher = launcher_of(line.command);
    line.exports = exports;
    if (!line.launcher.empty()) lines.push_back(line);
  }
  return lines;
}

// The hosts a line needs: 0 for this one, else how many simulated ones. srun always needs a Slurm,
// and the one the test makes spans the simulated hosts (a step without -N runs on node0).
int hosts_needed(const DocLine& l) {
  static const std::regex nnodes(R"re(--nnodes[ =](\d+))re"), slurm_nodes(R"re((?:^|\s)-N (\d+))re");
  std::smatch m;
  if (std::regex_search(l.command, m, nnodes)) return std::stoi(m[1]);
  if (l.launcher == "srun") return std::regex_search(l.command, m, slurm_nodes) ? std::stoi(m[1]) : 2;
  if (l.names("--hostfile") || l.names("node0") || l.names("node1")) return 2;
  return 0;
}

// "on node1" in the comment: the host that line runs on; -1 when the comment names none.
int own_node(const DocLine& l) {
  static const std::regex on_node(R"re(\bon node(\d+)\b)re");
  std::smatch m;
  return std::regex_search(l.comment, m, on_node) ? std::stoi(m[1]) : -1;
}

// What a reader writes for a placeholder: `<rank 0's host>` is node0.
std::string as_a_reader_writes(std::string command) {
  return std::regex_replace(command, std::regex("<rank 0's host>"), "node0");
}

// What the programs print when they finish, one of which each line's output must contain.
bool finished(const std::string& output) {
  for (const char* done :
       {"# Out of bounds values : 0 OK", "final loss", "test accuracy", "workers finished successfully"})
    if (output.find(done) != std::string::npos) return true;
  return false;
}

bool installed(const std::string& launcher) {
  if (launcher == "tinyddp-run") return fs::exists(bin("tinyddp-run"));
  for (const char* dir : {"/usr/bin/", "/usr/local/bin/"})
    if (access((dir + launcher).c_str(), X_OK) == 0) return true;
  return false;
}

// No variable of the caller's may help: the launcher must be enough. (Empty counts as unset.)
std::vector<std::string> launcher_env(const std::vector<std::string>& more = {}) {
  std::vector<std::string> env = {"MASTER_ADDR=", "MASTER_PORT=", "RANK=", "WORLD_SIZE=", "LOCAL_RANK=",
                                  "TINYDDP_TOKEN=", "TINYDDP_LAUNCHER_STORE=", "TINYDDP_FAULT=", "TINYDDP_TRACE=",
                                  // the built programs on PATH, as `cmake --install` puts them
                                  "PATH=" + std::string(TINYDDP_BIN_DIR) +
                                      ":/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
                                  // mpirun refuses root without these (the simulated hosts need root)
                                  "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"};
  env.insert(env.end(), more.begin(), more.end());
  return env;
}

// The block's export lines, run once: NAME=value for each, to give every host the same.
std::vector<std::string> evaluate_exports(const std::vector<std::string>& exports) {
  std::vector<std::string> values;
  for (const std::string& line : exports) {
    const std::string name = line.substr(7, line.find('=') - 7);
    auto out = finish_child(spawn_program({"/bin/bash", "-c", line + "; printf %s \"$" + name + "\""}), 30s);
    REQUIRE_MESSAGE(out.ok(), line, ": ", out.describe());
    values.push_back(name + "=" + out.report);
  }
  return values;
}

// A directory laid out like the repository root, as the pages' lines expect.
struct ReaderTree {
  TempDir dir{"tinyddp_doc_lines"};
  bool have_data = false;
  ReaderTree() {
    fs::create_directories(dir.path / "build");
    fs::create_directory_symlink(TINYDDP_BIN_DIR, dir.path / "build/bin");
    const std::string digits = digits_data();
    have_data = !digits.empty();
    if (have_data) fs::create_directory_symlink(fs::path(digits).parent_path(), dir.path / "data");
  }
  std::vector<std::string> shell(const std::string& command) const {
    return {"/bin/bash", "-c", "cd '" + dir.path.string() + "' && " + command};
  }
};

void check_outcome(const DocLine& l, const ChildOutcome& out, const std::string& who = "") {
  INFO(l.where(), who);
  CHECK_MESSAGE(out.ok(), out.describe());
  CHECK_MESSAGE(finished(out.report), "no program said it finished:\n", out.report);
  CHECK_MESSAGE(out.report.find("tinyddp error") == std::string::npos, out.report);
}

std::vector<DocLine> all_lines() {
  std::vector<DocLine> lines = launcher_lines("README.md");
  const std::vector<DocLine> more = launcher_lines("docs/launchers.md");
  lines.insert(lines.end(), more.begin(), more.end());
  return lines;
}

bool ready_to_run(const DocLine& l, const ReaderTree& tree) {
  if (!installed(l.launcher)) {
    TINYDDP_SKIP_PART(l.where(), ": ", l.launcher,
                      " is not installed (make test installs it as root: scripts/deps.sh --tests)");
    return false;
  }
  if (l.names("data/") || l.names("digits")) {
    if (!tree.have_data) {
      TINYDDP_SKIP_PART(l.where(), ": digits.csv.gz is absent (make data extracts it)");
      return false;
    }
  }
  return true;
}

}  // namespace

TEST_CASE("docs: the pages' launcher lines are found, each launcher's") {
  const std::vector<DocLine> lines = all_lines();
  std::map<std::string, int> per_launcher;
  int one_host = 0, several = 0;
  for (const DocLine& l : lines) {
    ++per_launcher[l.launcher];
    (hosts_needed(l) ? several : one_host)++;
  }
  // Losing lines (a fence renamed, a launcher respelled) must not pass for success.
  CHECK(per_launcher["tinyddp-run"] >= 4);
  CHECK(per_launcher["torchrun"] >= 3);
  CHECK(per_launcher["srun"] >= 2);
  CHECK(per_launcher["mpirun"] >= 3);
  CHECK(one_host >= 5);
  CHECK(several >= 5);
  // The pairs said to run on node0 and node1 are pairs.
  std::map<std::pair<std::string, int>, std::set<int>> nodes;
  for (const DocLine& l : lines)
    if (own_node(l) >= 0) nodes[{l.page, l.block}].insert(own_node(l));
  for (const auto& [where, set] : nodes)
    CHECK_MESSAGE((set == std::set<int>{0, 1}), where.first, " block ", where.second);
}

TEST_CASE("docs: every one-host launcher line runs as written") {
  if (!programs_built({"tinyddp-run", "digits", "dummy_mgpu", "all_reduce_perf"})) return;
  ReaderTree tree;
  for (const DocLine& l : all_lines()) {
    if (hosts_needed(l) || !ready_to_run(l, tree)) continue;
    const std::string command = as_a_reader_writes(l.command);
    auto out = finish_child(spawn_program(tree.shell(command), launcher_env(evaluate_exports(l.exports))), 240s);
    check_outcome(l, out);
  }
}

namespace {

// node0 and node1: simulated hosts whose /etc/hosts names them so, for the lines that need several.
struct NamedCluster {
  std::unique_ptr<SimCluster> cluster;
  TempDir files{"tinyddp_doc_hosts"};

  explicit NamedCluster(int hosts) : cluster(std::make_unique<SimCluster>(hosts, "dl")) {
    if (!cluster->ready()) return;
    std::ofstream etc_hosts(files.file("hosts"));
    etc_hosts << "127.0.0.1 localhost\n";
    for (int i = 0; i < hosts; ++i)
      etc_hosts << cluster->address(i) << " node" << i << " " << cluster->name() << "-" << i << "\n";
    etc_hosts.close();
    // Each host has its own mount namespace: the file goes over /etc/hosts there, nowhere else.
    for (int i = 0; i < hosts; ++i) {
      auto bound = finish_child(cluster->start(i, {"/bin/mount", "--bind", files.file("hosts"), "/etc/hosts"}), 30s);
      REQUIRE_MESSAGE(bound.ok(), "host ", i, ": ", bound.describe());
    }
  }
  bool ready() const { return cluster->ready(); }
};

// mpirun's --hostfile: a line per host, as docs/launchers.md describes it, by address (the
// plm_rsh_agent is given the address it enters).
void write_mpi_hostfile(const NamedCluster& named, const std::string& path, int slots) {
  std::ofstream out(path);
  for (int i = 0; i < named.cluster->hosts(); ++i) out << named.cluster->address(i) << " slots=" << slots << "\n";
}

}  // namespace

TEST_CASE("docs: every multi-host launcher line runs as written, on simulated hosts node0 and node1") {
  if (!programs_built({"tinyddp-run", "digits", "dummy_mgpu", "all_reduce_perf"})) return;
  ReaderTree tree;
  std::vector<DocLine> lines;
  for (const DocLine& l : all_lines())
    if (hosts_needed(l) && ready_to_run(l, tree)) lines.push_back(l);
  if (lines.empty()) return;
  NamedCluster named(2);
  if (!named.ready()) {
    TINYDDP_SKIP("simulated hosts are not available here (", named.cluster->why_not(), ")");
  }
  const SimCluster& cluster = *named.cluster;
  write_mpi_hostfile(named, (tree.dir.path / "hosts").string(), 2);
  const std::vector<std::string> agent = {"OMPI_MCA_plm_rsh_agent=" + source_file("bench/cluster_mpi_agent.sh"),
                                          "SIM_CLUSTER=" + cluster.name()};
  std::unique_ptr<ChildOutcome> slurm_down;  // set when Slurm cannot run across the hosts
  std::string slurm_conf;
  std::unique_ptr<TempDir> slurm_dir;

  for (size_t i = 0; i < lines.size(); ++i) {
    const DocLine& l = lines[i];
    REQUIRE_MESSAGE(hosts_needed(l) == 2, l.where(), ": the test makes two hosts");
    std::vector<std::string> env = evaluate_exports(l.exports);
    if (own_node(l) >= 0) {
      // This line and its siblings of the same block, each on its node, at the same time.
      std::vector<DocLine> group{l};
      while (i + 1 < lines.size() && lines[i + 1].page == l.page && lines[i + 1].block == l.block &&
             own_node(lines[i + 1]) >= 0)
        group.push_back(lines[++i]);
      std::vector<Child> started;
      for (auto it = group.rbegin(); it != group.rend(); ++it)  // node0, which hosts the store, last
        started.push_back(cluster.start(own_node(*it), tree.shell(as_a_reader_writes(it->command)), launcher_env(env)));
      const auto deadline = Clock::now() + 240s;
      for (size_t k = 0; k < started.size(); ++k)
        check_outcome(group[group.size() - 1 - k], finish_child(started[k], deadline));
      continue;
    }
    if (l.launcher == "torchrun") {  // the same command on every node
      std::vector<Child> started;
      for (int host = cluster.hosts() - 1; host >= 0; --host)
        started.push_back(cluster.start(host, tree.shell(l.command), launcher_env(env)));
      const auto deadline = Clock::now() + 240s;
      ChildOutcome node0;
      for (size_t k = 0; k < started.size(); ++k) {
        ChildOutcome out = finish_child(started[k], deadline);
        INFO(l.where(), " on node", started.size() - 1 - k);
        CHECK_MESSAGE(out.ok(), out.describe());
        if (k + 1 == started.size()) node0 = out;
      }
      check_outcome(l, node0, " (node0)");
      continue;
    }
    if (l.launcher == "mpirun") {
      env.insert(env.end(), agent.begin(), agent.end());
      // Host 0's network and a mount namespace of its own for /etc/hosts; this machine's pid space.
      const std::string script = "mount --bind '" + named.files.file("hosts") + "' /etc/hosts && cd '" +
                                 tree.dir.path.string() + "' && " + as_a_reader_writes(l.command);
      check_outcome(l, finish_child(spawn_program({"/usr/bin/env", "ip", "netns", "exec",
                                                   "tdsim-" + cluster.name() + "-0", "unshare", "--mount",
                                                   "--propagation", "private", "/bin/bash", "-c", script},
                                                  launcher_env(env)),
                                    240s));
      continue;
    }
    if (l.launcher == "srun") {
      if (!slurm_dir && !slurm_down) {
        slurm_dir = std::make_unique<TempDir>("tinyddp_doc_slurm");
        auto up = finish_child(spawn_program({source_file("scripts/slurm_localhost.sh"), "start",
                                              slurm_dir->file("cluster"), std::to_string(getpid()), "--sim",
                                              cluster.name(), std::to_string(cluster.hosts())}),
                               120s);
        if (up.ok())
          slurm_conf = "SLURM_CONF=" + slurm_dir->file("cluster") + "/slurm.conf";
        else
          slurm_down = std::make_unique<ChildOutcome>(up);
      }
      if (slurm_down) {
        TINYDDP_SKIP_PART(l.where(), ": a Slurm across the simulated hosts did not start (", slurm_down->report, ")");
        continue;
      }
      env.push_back(slurm_conf);
      check_outcome(l, finish_child(cluster.start(0, tree.shell(l.command), launcher_env(env)), 240s));
      continue;
    }
    FAIL_CHECK(l.where(), ": no way to run this line on several hosts");
  }
  if (slurm_dir && !slurm_down)
    finish_child(spawn_program({source_file("scripts/slurm_localhost.sh"), "stop", slurm_dir->file("cluster")}), 60s);
}
