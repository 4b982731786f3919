// The launcher, through the real bin/tinyddp-run and through the Launcher class: environment,
// output prefixes, failure handling, restarts, signals, orphans, and two nodes on one host.
#include <doctest/doctest.h>

#include <sched.h>
#include <signal.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "tinyddp/comm/cpu_binding.h"
#include "tinyddp/comm/launch/launcher.h"
#include "tinyddp/comm/store/tcp_store.h"
#include "tinyddp/core/error.h"
#include "test/comm/helpers/child_process.h"
#include "test/test_support.h"

using namespace tinyddp;
using namespace tinyddp::comm;
using namespace std::chrono_literals;
using namespace tinyddp::testing;

namespace {

const std::string kRun = std::string(TINYDDP_BIN_DIR) + "/tinyddp-run";
const std::string kWorker = std::string(TINYDDP_BIN_DIR) + "/test_rendezvous_worker";

// tinyddp-run with no TINYDDP_TOKEN of ours: one node then makes up its own, two nodes use none.
Child launch(const std::vector<std::string>& argv) { return spawn_program(argv, {"TINYDDP_TOKEN="}); }

ChildOutcome run_launcher(std::vector<std::string> args, std::chrono::seconds timeout = 60s) {
  args.insert(args.begin(), kRun);
  return finish_child(launch(args), timeout);
}

bool contains(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

// A scratch directory for one test, removed afterwards.
struct ScratchDir {
  std::filesystem::path path;
  ScratchDir() {
    path = std::filesystem::temp_directory_path() / ("tinyddp-launcher-" + std::to_string(getpid()) + "-" +
                                                     std::to_string(Clock::now().time_since_epoch().count()));
    std::filesystem::create_directories(path);
  }
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
  std::vector<pid_t> pids(const std::string& prefix) {
    std::vector<pid_t> found;
    for (auto& entry : std::filesystem::directory_iterator(path))
      if (entry.path().filename().string().rfind(prefix, 0) == 0) {
        std::ifstream in(entry.path());
        pid_t pid = 0;
        if (in >> pid) found.push_back(pid);
      }
    return found;
  }
};

// Lines captured from a Launcher run in this process.
struct Captured {
  std::vector<std::string> lines;
  std::vector<std::string> log;
  LauncherOptions options(std::vector<std::string> program, int n) {
    LauncherOptions o;
    o.nproc_per_node = n;
    o.program = std::move(program);
    o.grace = 2s;
    o.rendezvous_timeout = 30s;
    o.output = [this](int rank, int stream, std::string_view line) {
      lines.push_back((stream == 2 ? "err " : "out ") + std::to_string(rank) + ": " + std::string(line));
    };
    o.log = [this](LogLevel, const std::string& line) { log.push_back(line); };
    return o;
  }
  bool has(const std::string& line) const { return std::find(lines.begin(), lines.end(), line) != lines.end(); }
};

}  // namespace

TEST_CASE("tinyddp-run: 4 workers get their environment and their output comes back prefixed") {
  auto outcome = run_launcher({"-n", "4", "--", "/bin/sh", "-c",
                               "echo \"rank=$RANK world=$WORLD_SIZE local=$LOCAL_RANK/$LOCAL_WORLD_SIZE "
                               "addr=$MASTER_ADDR restart=$TINYDDP_RESTART_COUNT store=$TINYDDP_LAUNCHER_STORE "
                               "token=${#TINYDDP_TOKEN} port=$MASTER_PORT\"; echo to-stderr >&2"});
  REQUIRE_MESSAGE(outcome.ok(), outcome.describe());
  for (int rank = 0; rank < 4; ++rank) {
    std::string r = std::to_string(rank);
    CHECK_MESSAGE(contains(outcome.report, "[rank " + r + "] rank=" + r + " world=4 local=" + r +
                                               "/4 addr=127.0.0.1 restart=0 store=1 token=32 port="),
                  outcome.report);
    CHECK(contains(outcome.report, "[rank " + r + "] to-stderr"));
  }
  CHECK(contains(outcome.report, "tinyddp-run: all 4 workers finished successfully"));
  // A free port was picked, the same for everyone.
  auto at = outcome.report.find("port=");
  REQUIRE(at != std::string::npos);
  std::string port = outcome.report.substr(at + 5, outcome.report.find('\n', at) - at - 5);
  CHECK(std::stoi(port) > 0);
  size_t same = 0;
  for (size_t p = 0; (p = outcome.report.find("port=" + port + "\n", p)) != std::string::npos; ++p) ++same;
  CHECK(same == 4);
}

namespace {

// Each worker's allowed CPUs, as its own /proc/self/status says, by rank.
std::map<int, std::set<int>> worker_cpus_under(std::vector<std::string> flags, int n) {
  flags.insert(flags.begin(), {"-n", std::to_string(n)});
  for (const char* arg : {"--", "/bin/sh", "-c", "grep Cpus_allowed_list /proc/self/status"}) flags.push_back(arg);
  auto outcome = run_launcher(flags);
  REQUIRE_MESSAGE(outcome.ok(), outcome.describe());
  std::map<int, std::set<int>> cpus;
  std::stringstream lines(outcome.report);
  for (std::string line; std::getline(lines, line);) {
    const size_t tab = line.find("Cpus_allowed_list:\t");
    if (line.rfind("[rank ", 0) == 0 && tab != std::string::npos)
      cpus[std::stoi(line.substr(6))] = cpu_list(line.substr(tab + 19));
  }
  REQUIRE_MESSAGE(cpus.size() == size_t(n), outcome.report);
  return cpus;
}

}  // namespace

TEST_CASE(
    "tinyddp-run: each worker starts on its own share of the CPUs, as mpirun binds; none and too many workers bind "
    "nothing") {
  cpu_set_t mine;
  REQUIRE(sched_getaffinity(0, sizeof mine, &mine) == 0);
  std::set<int> allowed;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &mine)) allowed.insert(c);
  const int count = int(allowed.size());
  if (count >= 2) {
    // Shares: not empty, disjoint, in rank order, within one CPU of each other in size, and all of them together.
    auto shares = worker_cpus_under({}, 2);
    std::set<int> all;
    for (auto& [rank, cpus] : shares) {
      CHECK_FALSE(cpus.empty());
      all.insert(cpus.begin(), cpus.end());
    }
    CHECK(all == allowed);
    CHECK(*shares[0].rbegin() < *shares[1].begin());
    CHECK(std::abs(int(shares[0].size()) - int(shares[1].size())) <= 1);
    for (auto& [rank, cpus] : worker_cpus_under({"--cpu-bind", "none"}, 2)) CHECK(cpus == allowed);
  }
  for (auto& [rank, cpus] : worker_cpus_under({}, count + 1)) CHECK(cpus == allowed);  // more workers than CPUs
  auto refused = run_launcher({"--cpu-bind", "cores", "true"});
  CHECK(refused.exit_code != 0);
  CHECK_MESSAGE(contains(refused.report, "--cpu-bind: cores not in {auto,none}"), refused.report);
}

TEST_CASE("tinyddp-run: 4 workers rendezvous by env:// through the launcher's store") {
  auto outcome = run_launcher({"-n", "4", kWorker});
  REQUIRE_MESSAGE(outcome.ok(), outcome.describe());
  for (int rank = 0; rank < 4; ++rank)
    CHECK_MESSAGE(contains(outcome.report, "[rank " + std::to_string(rank) + "] rank " + std::to_string(rank) +
                                               " of 4 joined (restart 0, saw all 4)"),
                  outcome.report);
}

TEST_CASE("tinyddp-run: a worker exiting 3 stops the others and is named with its code; nothing survives") {
  ScratchDir dir;
  std::string d = dir.path.string();
  // Ranks 0, 1, 3 record their pid and start a background child, then wait; rank 2 fails once they
  // are all set up.
  std::string script =
      "if [ $RANK = 2 ]; then "
      "  while [ $(ls " +
      d +
      " | grep -c '^bg') -lt 3 ]; do sleep 0.02; done; echo failing; exit 3; "
      "fi; "
      "echo $$ > " +
      d + "/worker.$RANK; sleep 1000 & echo $! > " + d + "/bg.$RANK; wait";
  auto outcome = run_launcher({"-n", "4", "--grace-ms", "3000", "/bin/sh", "-c", script});
  CHECK_MESSAGE(outcome.exit_code == 3, outcome.describe());
  CHECK_MESSAGE(contains(outcome.report, "tinyddp-run: worker rank 2 (local rank 2 on node 0, pid "), outcome.report);
  CHECK(contains(outcome.report, ") exited with code 3 (the first to fail); stopped the other 3 workers; no restarts"));
  CHECK(contains(outcome.report, "[rank 2] failing"));
  auto workers = dir.pids("worker.");
  auto background = dir.pids("bg.");
  CHECK(workers.size() == 3);
  CHECK(background.size() == 3);
  for (pid_t pid : workers) CHECK_MESSAGE(eventually([&] { return process_is_gone(pid); }, 5s), "worker ", pid);
  for (pid_t pid : background) CHECK_MESSAGE(eventually([&] { return process_is_gone(pid); }, 5s), "child ", pid);
}

TEST_CASE(
    "tinyddp-run: a worker killed by a signal is the root cause, not the peer that exits with an error just after") {
  ScratchDir dir;
  std::string d = dir.path.string();
  // What a data-parallel job does when one rank is SIGKILLed: its peers notice the lost connection and
  // exit with an error a few milliseconds later. Rank 1 is killed; ranks 0 and 2 exit 3 as soon as
  // they see it dead (a zombie, not yet reaped): well inside one of the launcher's 50 ms polls. Rank 1
  // leaves a child holding its output open, so its pipes do not tell of its death; only its exit does.
  std::string script =
      "if [ $RANK = 1 ]; then sleep 1000 & echo $$ > " + d + "/victim.tmp; mv " + d + "/victim.tmp " + d +
      "/victim; kill -KILL $$; fi; "
      "while [ ! -e " +
      d + "/victim ]; do sleep 0.001; done; v=$(cat " + d +
      "/victim); "
      "while [ -e /proc/$v ] && ! grep -q ') Z' /proc/$v/stat 2>/dev/null; do sleep 0.001; done; exit 3";
  auto outcome = run_launcher({"-n", "3", "--grace-ms", "3000", "/bin/sh", "-c", script});
  CHECK_MESSAGE(outcome.exit_code == 128 + SIGKILL, outcome.describe());
  CHECK_MESSAGE(contains(outcome.report, "tinyddp-run: worker rank 1 (local rank 1 on node 0, pid "), outcome.report);
  CHECK(contains(outcome.report,
                 ") was killed by SIGKILL (the first to fail); stopped the other 2 workers; no restarts"));
}

TEST_CASE("tinyddp-run: --max-restarts 1 with a worker that fails once succeeds on the second attempt") {
  auto outcome = run_launcher(
      {"-n", "4", "--max-restarts", "1", kWorker, "--fail-rank", "1", "--fail-code", "7", "--fail-on-restart", "0"});
  REQUIRE_MESSAGE(outcome.ok(), outcome.describe());
  CHECK(contains(outcome.report, "[rank 1] rank 1 of 4 joined (restart 0, saw all 4)"));
  for (int rank = 0; rank < 4; ++rank)
    CHECK(contains(outcome.report, "[rank " + std::to_string(rank) + "] rank " + std::to_string(rank) +
                                       " of 4 joined (restart 1, saw all 4)"));
  CHECK(contains(outcome.report, "exited with code 7; stopped the group; restart 1 of 1"));
  CHECK(contains(outcome.report, "all 4 workers finished successfully (after 1 restart)"));
}

TEST_CASE("Launcher: a worker that fails on every attempt uses up the restarts and is the root cause") {
  Captured captured;
  auto options = captured.options(
      {"/bin/sh", "-c", "echo attempt $TINYDDP_RESTART_COUNT; if [ $RANK = 1 ]; then kill -KILL $$; fi; sleep 1000"},
      3);
  options.max_restarts = 2;
  LaunchResult result = Launcher(options).run();
  REQUIRE(result.root_cause);
  CHECK(result.root_cause->rank == 1);
  CHECK(result.root_cause->signal == SIGKILL);
  CHECK(result.exit_code == 128 + SIGKILL);
  CHECK(result.restarts == 2);
  CHECK_MESSAGE(contains(result.summary,
                         "was killed by SIGKILL (the first to fail); stopped the other 2 workers; all 2 "
                         "restarts used"),
                result.summary);
  for (int attempt = 0; attempt < 3; ++attempt) CHECK(captured.has("out 1: attempt " + std::to_string(attempt)));
  std::string log;
  for (auto& line : captured.log) log += line + "\n";
  CHECK_MESSAGE(captured.log.size() == 2, log);
}

TEST_CASE("Launcher: flight records already in the named directory are moved to previous/ before the workers start") {
  ScratchDir dir;
  for (const char* name : {"rank-0.json", "rank-1.experts.json", "rank-7.json", "notes.txt"})
    std::ofstream(dir.path / name) << "{}";
  Captured captured;
  auto options = captured.options({"/bin/sh", "-c", "echo records: $(ls $TINYDDP_FLIGHT_RECORDER | grep -c ^rank-)"},
                                  2);
  options.flight_recorder_dir = dir.path.string();
  LaunchResult result = Launcher(options).run();
  REQUIRE_MESSAGE(result.exit_code == 0, result.summary);
  CHECK(captured.has("out 0: records: 0"));  // what the workers found: no record of another job
  for (const char* name : {"rank-0.json", "rank-1.experts.json", "rank-7.json"})
    CHECK_MESSAGE(std::filesystem::exists(dir.path / "previous" / name), name);
  CHECK(std::filesystem::exists(dir.path / "notes.txt"));
}

TEST_CASE("Launcher: a program that does not exist is an error before anything starts") {
  Captured captured;
  CHECK_THROWS_WITH_AS(Launcher(captured.options({"no-such-program-tinyddp"}, 2)).run(),
                       doctest::Contains("program 'no-such-program-tinyddp' was not found on PATH"), Error);
  CHECK_THROWS_WITH_AS(Launcher{captured.options({}, 2)}, doctest::Contains("no program to run"), Error);
  auto two_nodes = captured.options({"/bin/true"}, 2);
  two_nodes.nnodes = 2;
  CHECK_THROWS_WITH_AS(Launcher{two_nodes}, doctest::Contains("needs --master-port"), Error);
}

TEST_CASE("tinyddp-run: SIGTERM is forwarded to the workers, which get to finish") {
  Child launcher = launch({kRun, "-n", "2", "/bin/sh", "-c",
                           "trap 'echo got TERM; exit 0' TERM; echo ready; while true; do sleep 0.05; done"});
  ChildGuard guard{launcher};
  std::string seen = read_until(launcher.out_fd, "ready", 20s);
  seen += read_until(launcher.out_fd, "ready", 20s);
  REQUIRE_MESSAGE(std::count(seen.begin(), seen.end(), '\n') >= 2, seen);
  kill(launcher.pid, SIGTERM);
  auto outcome = finish_child(launcher, 30s);
  outcome.report = seen + outcome.report;
  CHECK_MESSAGE(outcome.exit_code == 128 + SIGTERM, outcome.describe());
  CHECK(contains(outcome.report, "[rank 0] got TERM"));
  CHECK(contains(outcome.report, "[rank 1] got TERM"));
  CHECK(contains(outcome.report, "stopped by SIGTERM"));
}

TEST_CASE("tinyddp-run: workers do not outlive a launcher that is killed outright") {
  ScratchDir dir;
  Child launcher = launch({kRun, "-n", "2", "/bin/sh", "-c",
                           "echo $$ > " + dir.path.string() + "/worker.$RANK; echo ready; exec sleep 1000"});
  ChildGuard guard{launcher};
  std::string seen = read_until(launcher.out_fd, "ready", 20s);
  seen += read_until(launcher.out_fd, "ready", 20s);
  REQUIRE(eventually([&] { return dir.pids("worker.").size() == 2; }));
  kill(launcher.pid, SIGKILL);
  finish_child(launcher, 10s);
  for (pid_t pid : dir.pids("worker.")) CHECK_MESSAGE(eventually([&] { return process_is_gone(pid); }, 5s), pid);
}

TEST_CASE("tinyddp-run: two nodes on one host, as on a cluster") {
  int port = free_loopback_port();
  auto node = [&](int rank, const std::string& script) {
    return launch({kRun, "-n", "2", "--nnodes", "2", "--node-rank", std::to_string(rank), "--master-addr", "127.0.0.1",
                   "--master-port", std::to_string(port), "--grace-ms", "2000", "/bin/sh", "-c", script});
  };
  SUBCASE("both succeed, with global ranks") {
    std::string script = "echo \"rank $RANK of $WORLD_SIZE, node $GROUP_RANK, local $LOCAL_RANK\"";
    Child n1 = node(1, script);
    ChildGuard guard_n1{n1};
    Child n0 = node(0, script);
    ChildGuard guard_n0{n0};
    auto o0 = finish_child(n0, 60s);
    auto o1 = finish_child(n1, 60s);
    REQUIRE_MESSAGE(o0.ok(), o0.describe());
    REQUIRE_MESSAGE(o1.ok(), o1.describe());
    CHECK(contains(o0.report, "[rank 1] rank 1 of 4, node 0, local 1"));
    CHECK(contains(o1.report, "[rank 2] rank 2 of 4, node 1, local 0"));
    CHECK(contains(o1.report, "[rank 3] rank 3 of 4, node 1, local 1"));
  }
  SUBCASE("a failure on node 1 stops node 0 too, and both name it") {
    std::string script = "if [ $RANK = 3 ]; then sleep 0.3; exit 4; fi; exec sleep 1000";
    Child n0 = node(0, script);
    ChildGuard guard_n0{n0};
    Child n1 = node(1, script);
    ChildGuard guard_n1{n1};
    auto o0 = finish_child(n0, 60s);
    auto o1 = finish_child(n1, 60s);
    CHECK_MESSAGE(o0.exit_code == 4, o0.describe());
    CHECK_MESSAGE(o1.exit_code == 4, o1.describe());
    CHECK(contains(o0.report, "worker rank 3 (local rank 1 on node 1, pid "));
    CHECK(contains(o1.report, "worker rank 3 (local rank 1 on node 1, pid "));
  }
  SUBCASE("SIGTERM to node 0's launcher stops the workers on both nodes, with no restart") {
    std::string script = "echo ready; exec sleep 1000";
    Child n0 = launch({kRun, "-n", "2", "--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1",
                       "--master-port", std::to_string(port), "--max-restarts", "3", "/bin/sh", "-c", script});
    ChildGuard guard_n0{n0};
    Child n1 = launch({kRun, "-n", "2", "--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1",
                       "--master-port", std::to_string(port), "--max-restarts", "3", "/bin/sh", "-c", script});
    ChildGuard guard_n1{n1};
    std::string seen = read_until(n1.out_fd, "ready", 30s) + read_until(n1.out_fd, "ready", 30s);
    REQUIRE_MESSAGE(std::count(seen.begin(), seen.end(), '\n') >= 2, seen);
    kill(n0.pid, SIGTERM);
    auto o0 = finish_child(n0, 60s);
    auto o1 = finish_child(n1, 60s);
    CHECK_MESSAGE(o0.exit_code == 128 + SIGTERM, o0.describe());
    CHECK_MESSAGE(o1.exit_code == 1, o1.describe());
    CHECK_MESSAGE(contains(o1.report, "the job was stopped on another node (node 0 got SIGTERM)"), o1.report);
    CHECK_FALSE(contains(o1.report, "restart 1 of 3"));
  }
  SUBCASE("nodes that disagree on the job's shape are refused") {
    Child n0 = node(0, "exec sleep 1000");
    ChildGuard guard_n0{n0};
    // Node 0 has registered the job's shape before node 1 comes with another one.
    TcpStoreOptions watcher_options;
    watcher_options.token = "";
    TcpStore watcher("127.0.0.1", port, false, watcher_options);
    watcher.wait({"tinyddp/default/launcher/nnodes"}, 20s);
    auto o1 = finish_child(launch({kRun, "-n", "3", "--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1",
                                   "--master-port", std::to_string(port), "/bin/true"}),
                           60s);
    CHECK(o1.exit_code == 1);
    CHECK_MESSAGE(contains(o1.report, "this node has --nproc-per-node 3 but the node that registered first has 2"),
                  o1.report);
    kill(n0.pid, SIGTERM);
    auto o0 = finish_child(n0, 30s);
    CHECK(o0.exit_code == 128 + SIGTERM);
  }
}

TEST_CASE("a rank's compute threads: its own CPUs when a launcher bound it, else an even share of the host's") {
  CHECK(comm::compute_threads(1, 2, 2) == 1);    // tinyddp-run -n 2 on 2 CPUs: one each
  CHECK(comm::compute_threads(8, 16, 2) == 8);   // tinyddp-run -n 2 on 16 CPUs: its 8
  CHECK(comm::compute_threads(4, 64, 2) == 4);   // srun --cpu-bind, 4 CPUs a task on a 64-CPU node
  CHECK(comm::compute_threads(16, 16, 2) == 8);  // unbound: half the host each
  CHECK(comm::compute_threads(2, 2, 4) == 1);    // more ranks than CPUs: one each, never none
  CHECK(comm::compute_threads(0, 0, 0) == 1);    // nothing known: one
  CHECK(comm::compute_threads(16, 8, 2) == 8);   // an online count below the mask's: the mask's, shared
  CHECK(comm::allowed_cpu_count() >= 1);
}

TEST_CASE("CPU lists as Linux writes them: written in runs, read back, and compared between ranks") {
  CHECK(comm::cpu_list_text({}) == "");
  CHECK(comm::cpu_list_text({5}) == "5");
  CHECK(comm::cpu_list_text({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11");
  CHECK(comm::parse_cpu_list("0-3,8,10-11") == std::vector<int>{0, 1, 2, 3, 8, 10, 11});
  CHECK(comm::parse_cpu_list("") == std::vector<int>{});
  for (const char* bad : {"a", "1,", "3-1", "1--2", ",2", "1 2"})
    CHECK_THROWS_WITH_AS(comm::parse_cpu_list(bad), doctest::Contains("CPU list"), Error);
  // This process's own list is the one the kernel shows in /proc/self/status.
  std::ifstream status("/proc/self/status");
  std::string line, kernel;
  while (std::getline(status, line))
    if (line.rfind("Cpus_allowed_list:", 0) == 0) kernel = line.substr(line.find('\t') + 1);
  CHECK(comm::own_cpu_list() == kernel);
  // Sharing: any common CPU, or a rank whose CPUs are unknown.
  CHECK_FALSE(comm::may_share_cpus("0", {"1"}));
  CHECK_FALSE(comm::may_share_cpus("0-3", {"4-7", "8-11"}));
  CHECK(comm::may_share_cpus("0-3", {"4-7", "3"}));
  CHECK(comm::may_share_cpus("0-1", {"0-1"}));
  CHECK(comm::may_share_cpus("", {"1"}));
  CHECK(comm::may_share_cpus("0", {""}));
}
