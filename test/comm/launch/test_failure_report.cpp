// The failure report for torchrun (comm/launch/failure_report.h): the error file torchrun reads, and
// which rank it names first -- the first to report, or a peer on this host whose process is gone.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "tinyddp/comm/launch/failure_report.h"
#include "tinyddp/comm/store/hash_store.h"
#include "tinyddp/comm/store/prefix_store.h"
#include "test/comm/helpers/child_process.h"
#include "test/test_support.h"

using namespace tinyddp;
using namespace tinyddp::comm;
using namespace std::chrono_literals;

namespace {

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

long long timestamp_of(const nlohmann::json& error) {
  return std::stoll(error.at("message").at("extraInfo").at("timestamp").get<std::string>());
}

std::string this_host() {
  char name[256] = {0};
  gethostname(name, sizeof name - 1);
  return name;
}

// A store as rendezvous leaves it for `world` ranks, rank r's process being pids[r] on this host.
std::shared_ptr<HashStore> joined_store(const std::vector<pid_t>& pids) {
  auto store = std::make_shared<HashStore>();
  PrefixStore rdzv(*store, "rdzv");
  rdzv.set("world_size", std::to_string(pids.size()));
  for (size_t r = 0; r < pids.size(); ++r)
    rdzv.set("rank/" + std::to_string(r), this_host() + " pid " + std::to_string(pids[r]) + " #1234");
  return store;
}

}  // namespace

TEST_CASE(
    "failure report: the error file is torchrun's format; the first to report is the root cause, the next a second "
    "later") {
  testing::TempDir dir;
  auto store = joined_store({getpid(), getpid()});
  FailureReportOptions options;
  options.linger = 0ms;
  options.error_file = dir.file("rank1.json");
  report_failure_to_launcher(store.get(), 1, "tinyddp error: deliberate\n  raised at x.cpp:1", options);
  options.error_file = dir.file("rank0.json");
  report_failure_to_launcher(store.get(), 0, "tinyddp error: peer rank 1 closed the connection", options);

  auto first = read_json(dir.file("rank1.json"));
  auto second = read_json(dir.file("rank0.json"));
  // torchrun shows message.extraInfo.py_callstack and sorts by message.extraInfo.timestamp.
  CHECK(first.at("message").at("message") == "rank 1: tinyddp error: deliberate");
  CHECK(first.at("message").at("extraInfo").at("py_callstack") ==
        "rank 1: tinyddp error: deliberate\n  raised at x.cpp:1");
  CHECK(timestamp_of(second) == timestamp_of(first) + 1);
  CHECK(second.at("message").at("extraInfo").at("py_callstack").get<std::string>().find("rank 1 failed first") !=
        std::string::npos);
}

TEST_CASE("failure report: a peer on this host whose process is gone failed first, whoever reports") {
  pid_t peer = fork();
  if (peer == 0) {
    pause();
    _exit(0);
  }
  kill(peer, SIGKILL);  // left a zombie, unreaped, as under torchrun until its next look
  REQUIRE(testing::eventually([&] { return testing::process_is_gone(peer); }));
  testing::TempDir dir;
  auto store = joined_store({getpid(), peer});
  FailureReportOptions options;
  options.linger = 0ms;
  options.error_file = dir.file("rank0.json");
  report_failure_to_launcher(store.get(), 0, "tinyddp error: shm transport: rank 1 died", options);
  waitpid(peer, nullptr, 0);
  auto report = read_json(dir.file("rank0.json"));
  CHECK(report.at("message").at("extraInfo").at("py_callstack").get<std::string>().find("rank 1 failed first") !=
        std::string::npos);
  CHECK(PrefixStore(*store, "failure").get("first").rfind("1 ", 0) == 0);
}

TEST_CASE("failure report: nothing is written outside torchrun") {
  unsetenv("TORCHELASTIC_ERROR_FILE");
  auto store = std::make_shared<HashStore>();
  report_failure_to_launcher(store.get(), 0, "whatever");  // no file, no store keys, no wait
  CHECK(store->num_keys() == 0);
}
