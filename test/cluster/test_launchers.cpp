// Our programs under the launchers people already use, each as it comes, with no variable added:
//   torchrun   Debian's (PyTorch 1.13, its default static rendezvous; it needs `-r 1 -t 1` on
//              Python 3.11), and any listed in TINYDDP_TEST_TORCHRUNS (colon-separated, e.g. a venv's
//              PyTorch 2.x, run with --standalone and with --rdzv-backend c10d): the ranks join the
//              agent's store; a restart is told by TORCHELASTIC_RESTART_COUNT; torchrun's "Root
//              Cause" names the rank that failed;
//   mpirun     Open MPI's, with no MASTER_ADDR/MASTER_PORT;
//   srun       a one-node Slurm (scripts/slurm_localhost.sh), with no MASTER_ADDR/MASTER_PORT.
// Each skips with a message when its launcher is not installed (make test installs them as root).
#include <doctest/doctest.h>

#include <sstream>

#include "test/cluster/cluster_support.h"
#include "test/test_skip.h"
#include "test/test_support.h"

using namespace tinyddp;
using namespace tinyddp::testing;
using namespace std::chrono_literals;

namespace {

// No MASTER_ADDR/MASTER_PORT of the caller's may leak in: the launcher must be enough.
// (An empty variable counts as unset.)
const std::vector<std::string> kClean = {"MASTER_ADDR=", "MASTER_PORT=", "TINYDDP_TOKEN=", "TINYDDP_LAUNCHER_STORE=",
                                         "TINYDDP_FAULT="};

std::vector<std::string> clean_env(const std::vector<std::string>& more = {}) {
  std::vector<std::string> env;
  for (const std::string& unset : kClean) {
    bool given = false;
    for (const std::string& m : more) given |= m.rfind(unset, 0) == 0;
    if (!given) env.push_back(unset);
  }
  env.insert(env.end(), more.begin(), more.end());
  return env;
}

ChildOutcome run(const std::vector<std::string>& argv, const std::vector<std::string>& env = {},
                 std::chrono::seconds timeout = 120s) {
  ChildOutcome outcome = finish_child(spawn_program(argv, clean_env(env)), timeout);
  CHECK_MESSAGE(!outcome.timed_out, argv[0], " did not finish within ", timeout.count(), " s:\n", outcome.report);
  return outcome;
}

// torchrun's "Root Cause" section, from its header to the closing line.
std::string root_cause(const std::string& output) {
  size_t at = output.find("Root Cause");
  return at == std::string::npos ? "" : output.substr(at, output.find("=====", at) - at);
}

struct Torchrun {
  std::string path;
  bool legacy;  // PyTorch 1.x: underscores in its flags, static rendezvous on --master_port
  // torchrun [flags] --no-python <nproc> program...: 1.x static rendezvous, or 2.x --standalone.
  // `quick`: PyTorch 1.x looks at its workers every second instead of every 5 (its default, kept for
  // the root-cause cases, whose timing depends on it).
  std::vector<std::string> command(int nproc, std::vector<std::string> program, std::vector<std::string> flags = {},
                                   bool quick = true) const {
    std::vector<std::string> argv{path};
    if (legacy) {
      argv.insert(argv.end(), {"-r", "1", "-t", "1", "--no_python", "--nproc_per_node", std::to_string(nproc),
                               "--master_port", std::to_string(free_loopback_port())});
      if (quick) argv.insert(argv.end(), {"--monitor_interval", "1"});
    } else {
      argv.insert(argv.end(), {"--standalone", "--no-python", "--nproc-per-node", std::to_string(nproc)});
    }
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.insert(argv.end(), program.begin(), program.end());
    return argv;
  }
};

std::vector<Torchrun> torchruns() {
  std::vector<Torchrun> found;
  if (access("/usr/bin/torchrun", X_OK) == 0) found.push_back({"/usr/bin/torchrun", true});
  if (const char* more = std::getenv("TINYDDP_TEST_TORCHRUNS")) {
    std::istringstream list(more);
    for (std::string path; std::getline(list, path, ':');)
      if (!path.empty() && access(path.c_str(), X_OK) == 0) found.push_back({path, false});
  }
  return found;
}

}  // namespace

TEST_CASE(
    "torchrun: workers join the agent's store, restart with TORCHELASTIC_RESTART_COUNT, and its Root Cause names the "
    "rank that failed") {
  if (!programs_built({"test_rendezvous_worker", "all_reduce_perf", "dummy_mgpu"})) return;
  auto launchers = torchruns();
  if (launchers.empty()) {
    TINYDDP_SKIP("no torchrun (Debian: apt-get install python3-torch, which make test installs as root)");
  }
  const std::string worker = bin("test_rendezvous_worker");
  for (const Torchrun& torchrun : launchers) {
    INFO(torchrun.path);
    auto joined = run(torchrun.command(2, {worker}));
    CHECK_MESSAGE(joined.ok(), joined.report);
    CHECK(contains(joined.report, "rank 0 of 2 joined (restart 0, saw all 2)"));
    CHECK(contains(joined.report, "rank 1 of 2 joined (restart 0, saw all 2)"));

    if (!torchrun.legacy) {  // PyTorch 2.x: the c10d rendezvous backend too
      auto c10d = run({torchrun.path, "--rdzv-backend", "c10d", "--rdzv-endpoint",
                       "127.0.0.1:" + std::to_string(free_loopback_port()), "--no-python", "--nproc-per-node", "2",
                       worker});
      CHECK_MESSAGE(c10d.ok(), c10d.report);
      CHECK(contains(c10d.report, "rank 1 of 2 joined (restart 0, saw all 2)"));
    }

    // Rank 1 fails in the first attempt only; the second attempt knows it is the second.
    auto restarted = run(torchrun.command(2, {worker, "--fail-rank", "1", "--fail-code", "7"},
                                          {torchrun.legacy ? "--max_restarts" : "--max-restarts", "1"}));
    CHECK_MESSAGE(restarted.ok(), restarted.report);
    CHECK(contains(restarted.report, "rank 0 of 2 joined (restart 1, saw all 2)"));

    // A rank that raises: its error file makes it the root cause, with its message.
    auto raised = run(torchrun.command(2, {worker, "--throw-rank", "1"}, {}, /*quick=*/false));
    CHECK(raised.exit_code != 0);
    std::string cause = root_cause(raised.report);
    CHECK_MESSAGE(contains(cause, "rank      : 1 (local_rank: 1)"), raised.report);
    CHECK_MESSAGE(contains(cause, "deliberate failure of rank 1"), raised.report);

    // A rank SIGKILLed in the middle of a step (it can write nothing): still the root cause, not rank 0
    // that lost it a moment later.
    auto killed = run(torchrun.command(2, {bin("dummy_mgpu"), "--device", "cpu", "--epochs", "2", "--save", ""}, {},
                                       /*quick=*/false),
                      {"TINYDDP_FAULT=backward:3:1"});
    CHECK(killed.exit_code != 0);
    cause = root_cause(killed.report);
    CHECK_MESSAGE(contains(cause, "rank      : 1 (local_rank: 1)"), killed.report);
    CHECK_MESSAGE(contains(cause, "Signal 9 (SIGKILL)"), killed.report);
  }
  // all_reduce_perf's results, checked, under Debian's torchrun.
  auto perf = run(
      launchers.front().command(2, {bin("all_reduce_perf"), "-b", "64K", "-e", "1M", "-f", "4", "-n", "2"}));
  CHECK_MESSAGE(perf.ok(), perf.report);
  CHECK(contains(perf.report, "# Out of bounds values : 0 OK"));
}

TEST_CASE("mpirun: the ranks find the store with no MASTER_ADDR/MASTER_PORT") {
  if (!programs_built({"test_rendezvous_worker", "all_reduce_perf", "dummy_mgpu"})) return;
  std::string mpirun = access("/usr/bin/mpirun", X_OK) == 0 ? "/usr/bin/mpirun" : "";
  if (mpirun.empty()) {
    TINYDDP_SKIP("no mpirun (Debian: apt-get install openmpi-bin, which make test installs as root)");
  }
  std::vector<std::string> mpi = {mpirun, "--allow-run-as-root", "--oversubscribe", "-np"};
  auto with = [&](int np, std::vector<std::string> program) {
    auto argv = mpi;
    argv.push_back(std::to_string(np));
    argv.insert(argv.end(), program.begin(), program.end());
    return argv;
  };
  auto joined = run(with(3, {bin("test_rendezvous_worker")}));
  CHECK_MESSAGE(joined.ok(), joined.report);
  for (int r = 0; r < 3; ++r) CHECK(contains(joined.report, "rank " + std::to_string(r) + " of 3 joined"));
  auto perf = run(with(2, {bin("all_reduce_perf"), "-b", "64K", "-e", "1M", "-f", "4", "-n", "2"}));
  CHECK_MESSAGE(perf.ok(), perf.report);
  CHECK(contains(perf.report, "# Out of bounds values : 0 OK"));
  auto trained = run(with(2, {bin("dummy_mgpu"), "--device", "cpu", "--epochs", "2", "--save", ""}));
  CHECK_MESSAGE(trained.ok(), trained.report);
  CHECK(count_of(trained.report, "2 CPU workers, 2 epochs: final loss") == 1);
}

TEST_CASE("srun: the tasks of a Slurm step find the store with no MASTER_ADDR/MASTER_PORT") {
  if (!programs_built({"test_rendezvous_worker", "all_reduce_perf", "dummy_mgpu"})) return;
  std::string script = source_file("scripts/slurm_localhost.sh");
  auto why = finish_child(spawn_program({script, "check"}), 30s);
  if (!why.ok()) {
    TINYDDP_SKIP("Slurm cannot run here (", why.report, ")");
  }
  TempDir dir("tinyddp_slurm");
  auto started = finish_child(spawn_program({script, "start", dir.file("cluster"), std::to_string(getpid())}), 60s);
  REQUIRE_MESSAGE(started.ok(), "a one-node Slurm did not start: ", started.report);
  struct Stop {
    std::string script, dir;
    ~Stop() { finish_child(spawn_program({script, "stop", dir}), 60s); }
  } stop{script, dir.file("cluster")};
  const std::string conf = "SLURM_CONF=" + dir.file("cluster") + "/slurm.conf";

  auto joined = run({"/usr/bin/srun", "-n", "3", bin("test_rendezvous_worker")}, {conf});
  CHECK_MESSAGE(joined.ok(), joined.report);
  for (int r = 0; r < 3; ++r) CHECK(contains(joined.report, "rank " + std::to_string(r) + " of 3 joined"));
  auto perf = run({"/usr/bin/srun", "-n", "2", bin("all_reduce_perf"), "-b", "64K", "-e", "1M", "-f", "4", "-n", "2"},
                  {conf});
  CHECK_MESSAGE(perf.ok(), perf.report);
  CHECK(contains(perf.report, "# Out of bounds values : 0 OK"));
  auto trained = run({"/usr/bin/srun", "-n", "2", bin("dummy_mgpu"), "--device", "cpu", "--epochs", "2", "--save", ""},
                     {conf});
  CHECK_MESSAGE(trained.ok(), trained.report);
  CHECK(count_of(trained.report, "2 CPU workers, 2 epochs: final loss") == 1);
}
