// A rank that is alive but stuck, under the real tinyddp-run: every other rank fails within the
// timeout (plus the moment it takes to judge the board), naming the stalled rank and the collective's
// sequence number; the launcher names the stalled rank as the root cause; the flight records say
// the same when read back (tinyddp-run --explain). And the waits before any collective: an
// unreachable store under TINYDDP_TIMEOUT.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tinyddp/comm/collective_watchdog.h"
#include "test/comm/helpers/child_process.h"
#include "test/test_support.h"

using namespace tinyddp;
using namespace tinyddp::testing;
using namespace std::chrono_literals;

namespace {

const std::string kRun = std::string(TINYDDP_BIN_DIR) + "/tinyddp-run";
const std::string kWorker = std::string(TINYDDP_BIN_DIR) + "/test_stall_worker";
constexpr int kTimeoutSeconds = 3;

bool contains(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

// Every "at_ms=<n>" on the lines that contain `marker`.
std::vector<long long> moments(const std::string& report, const std::string& marker) {
  std::vector<long long> found;
  std::istringstream lines(report);
  for (std::string line; std::getline(lines, line);) {
    auto at = line.find("at_ms=");
    if (contains(line, marker) && at != std::string::npos) found.push_back(std::stoll(line.substr(at + 6)));
  }
  return found;
}

// The sequence numbers named by "has not entered <op> #<n>" on `rank`'s lines.
std::set<long long> named_sequences(const std::string& report, int rank) {
  std::set<long long> found;
  std::regex pattern("has not entered [a-z_]+ #([0-9]+)");
  std::istringstream lines(report);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("[rank " + std::to_string(rank) + "]", 0) != 0) continue;
    for (std::sregex_iterator m(line.begin(), line.end(), pattern), end; m != end; ++m)
      found.insert(std::stoll((*m)[1]));
  }
  return found;
}

nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

struct StallRun {
  ChildOutcome outcome;
  TempDir records;
};

void run_stall(StallRun& run, const std::string& how) {
  run.outcome = finish_child(spawn_program({kRun, "-n", "3", "--grace-ms", "1000", kWorker, "--steps", "40",
                                            "--stall-rank", "1", "--stall-step", "3", "--stall", how},
                                           {"TINYDDP_TOKEN=", "TINYDDP_TIMEOUT=" + std::to_string(kTimeoutSeconds),
                                            "TINYDDP_FLIGHT_RECORDER=" + run.records.path.string(),
                                            "OMP_NUM_THREADS=1"}),
                             60s);
}

// What both stalls must show: ranks 0 and 2 fail after one timeout, each naming rank 1 and the same
// collective; that collective is the one their flight records were in.
void check_others_name_rank_1(const StallRun& run) {
  const std::string& report = run.outcome.report;
  REQUIRE_MESSAGE(run.outcome.exit_code != 0, run.outcome.describe());
  auto stalled = moments(report, "stalls in step");
  REQUIRE_MESSAGE(stalled.size() == 1, report);
  auto failed = moments(report, "failed at_ms=");
  REQUIRE_MESSAGE(failed.size() == 2, report);
  // When: after the timeout, plus at most the board's patience to judge who stalled. The stall line
  // and the others' entry into the collective are not one moment (rank 1 prints after it finished the
  // collective before, as the others did, and a busy machine may delay its print), so each bound has a
  // wide margin of what it tells apart: failing before the timeout ran out, and not failing by the
  // timeout at all (then nothing ends the job before finish_child gives up at 60 s).
  const long long timeout_ms = kTimeoutSeconds * 1000;
  const long long judge_ms = comm::CollectiveWatchdog::kVerdictPatience.count();
  for (long long at : failed) {
    CHECK_MESSAGE(at - stalled[0] < timeout_ms + judge_ms + 3000, "failed ", at - stalled[0], " ms after the stall\n",
                  report);
    CHECK_MESSAGE(at - stalled[0] > timeout_ms - 1000, "failed ", at - stalled[0],
                  " ms after the stall, before its timeout\n", report);
  }
  auto record0 = read_json(run.records.path / "rank-0.json");
  auto record2 = read_json(run.records.path / "rank-2.json");
  // Both wait with the same timeout, and the first to run out aborts the group: the other may then
  // fail on that abort ("error") a moment before its own timeout. Which one comes first is the
  // scheduler's choice; that one at least timed out.
  CAPTURE(record0["reason"]);
  CAPTURE(record2["reason"]);
  CHECK((record0["reason"] == "timeout" || record2["reason"] == "timeout"));
  for (const auto* record : {&record0, &record2})
    CHECK(((*record)["reason"] == "timeout" || (*record)["reason"] == "error"));
  const long long in = record0["last_started"].get<long long>();
  CHECK(record2["last_started"].get<long long>() == in);
  CHECK(record0["last_finished"].get<long long>() == in - 1);
  for (int rank : {0, 2}) {
    CHECK_MESSAGE(named_sequences(report, rank) == std::set<long long>{in}, "rank ", rank,
                  " names another collective\n", report);
    CHECK(contains(report, "[rank " + std::to_string(rank) + "] failed at_ms="));
  }
  CHECK_MESSAGE(contains(report, "stalled: rank 1 ("), report);  // with host and pid, from the board
  // The collective the others waited in is a bucket all-reduce of the step (bucket 0: one bucket).
  bool bucket_named = false;
  for (const auto& e : record0["entries"])
    if (e["sequence"] == in) bucket_named = e["op"] == "all_reduce" && e["bucket"] == 0 && e["state"] == "failed";
  CHECK_MESSAGE(bucket_named, record0.dump(1));
}

// The launcher's last line names rank 1 as the root cause, and how it stalled.
void check_launcher_names_rank_1(const StallRun& run, const std::string& stall) {
  const std::string& report = run.outcome.report;
  CHECK_MESSAGE(contains(report, "tinyddp-run: worker rank 1 (local rank 1 on node 0, pid "), report);
  CHECK_MESSAGE(contains(report, ") stalled: " + stall), report);
  CHECK(contains(report, "(the root cause)"));
}

}  // namespace

TEST_CASE("stall: a worker stopped with SIGSTOP is named by every rank and by the launcher as the root cause") {
  TINYDDP_SKIP_UNDER_TSAN();
  StallRun run;
  run_stall(run, "stop");
  check_others_name_rank_1(run);
  check_launcher_names_rank_1(run, "it was stopped by a signal (SIGSTOP or SIGTSTP: state T)");
  CHECK_FALSE(std::filesystem::exists(run.records.path / "rank-1.json"));  // a stopped process writes nothing
}

TEST_CASE("stall: a worker sleeping inside its train step is named, and its record shows where it stands") {
  TINYDDP_SKIP_UNDER_TSAN();
  StallRun run;
  run_stall(run, "sleep");
  check_others_name_rank_1(run);
  check_launcher_names_rank_1(run, "the others timed out waiting for it (rank 1 lags");
  // The launcher asked the sleeping rank for its record (SIGUSR1): it finished the collective before.
  auto record0 = read_json(run.records.path / "rank-0.json");
  auto record1 = read_json(run.records.path / "rank-1.json");
  CHECK(record1["reason"] == "SIGUSR1");
  CHECK(record1["last_finished"].get<long long>() == record0["last_started"].get<long long>() - 1);
  CHECK(record1["last_started"] == record1["last_finished"]);
  // The reader gives the same verdict from the files alone.
  auto explained = finish_child(spawn_program({kRun, "--explain", run.records.path.string()}), 20s);
  REQUIRE_MESSAGE(explained.ok(), explained.describe());
  CHECK_MESSAGE(contains(explained.report, "verdict: rank 1 lags, not in all_reduce #" +
                                               std::to_string(record0["last_started"].get<long long>())),
                explained.report);
  CHECK(contains(explained.report, "which ranks 0, 2 wait in"));
}

TEST_CASE("stall: an unreachable store fails after TINYDDP_TIMEOUT, saying where the timeout comes from") {
  TINYDDP_SKIP_UNDER_TSAN();
  const int port = free_loopback_port();  // nobody listens there
  auto start = Clock::now();
  auto outcome = finish_child(spawn_program({kWorker}, {"RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1",
                                                        "MASTER_PORT=" + std::to_string(port), "TINYDDP_TIMEOUT=3",
                                                        "TINYDDP_LAUNCHER_STORE=", "TINYDDP_TOKEN="}),
                              30s);
  auto took = Clock::now() - start;
  CHECK_MESSAGE(outcome.exit_code == 1, outcome.describe());
  CHECK(took >= 3s);  // it waits out its timeout (a busy machine only lengthens this)
  // The message below says it gave up after 3 s by its own clock; this only catches a wait that
  // outlives the timeout several times over (finish_child stops it at 30 s).
  CHECK(took < 15s);
  CHECK_MESSAGE(contains(outcome.report,
                         "could not connect to the store at 127.0.0.1:" + std::to_string(port) + ": gave up after 3."),
                outcome.report);
  CHECK(contains(outcome.report, "the timeout is 3.0 s (TINYDDP_TIMEOUT=<seconds>"));
}

TEST_CASE("stall: a bad TINYDDP_TIMEOUT is an error naming the variable, before anything waits") {
  TINYDDP_SKIP_UNDER_TSAN();
  auto outcome = finish_child(spawn_program({kWorker}, {"RANK=0", "WORLD_SIZE=1", "MASTER_ADDR=127.0.0.1",
                                                        "MASTER_PORT=1", "TINYDDP_TIMEOUT=5min"}),
                              30s);
  CHECK(outcome.exit_code == 1);
  CHECK_MESSAGE(contains(outcome.report, "TINYDDP_TIMEOUT='5min' is not a number of seconds above 0"), outcome.report);
}
