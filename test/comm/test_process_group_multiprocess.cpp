// Real processes: init_process_group over tcp:// (rank 0 hosting the store), and allreduce_perf
// under the tinyddp-run launcher, whose table must show every result exact.
#include <doctest/doctest.h>

#include <sys/stat.h>

#include "comm/process_group.h"
#include "test/comm/helpers/child_process.h"

using namespace tinyddp;
using namespace tinyddp::comm;
using namespace tinyddp::testing;
using namespace std::chrono_literals;

TEST_CASE("init_process_group over tcp:// joins 3 processes that then all-reduce") {
  const int world = 3, port = free_loopback_port();
  for (std::string transport : {"auto", "tcp"}) {
    CAPTURE(transport);
    std::vector<Child> children;
    for (int r = 0; r < world; ++r) {
      children.push_back(spawn_child([&, r](std::string& report) {
        ProcessGroupOptions options;
        options.transport = transport;
        options.timeout = 30s;
        auto pg = init_process_group("ring", "tcp://127.0.0.1:" + std::to_string(port), r, world, options);
        Tensor t = Tensor::from_vector(std::vector<int64_t>(100000, r + 1));
        pg->all_reduce(t)->wait();
        pg->barrier()->wait();  // rank 0 hosts the store: nobody leaves before everyone is done
        auto v = t.to_vector<int64_t>();
        bool ok = v.front() == 6 && v.back() == 6 && pg->rank() == r && pg->size() == world;
        if (!ok) report = "rank " + std::to_string(r) + " got " + std::to_string(v.front());
        return ok ? 0 : 1;
      }));
    }
    auto deadline = Clock::now() + 60s;
    for (int r = 0; r < world; ++r) {
      auto outcome = finish_child(children[size_t(r)], deadline);
      CHECK_MESSAGE(outcome.ok(), "rank ", r, ": ", outcome.describe());
    }
  }
}

TEST_CASE("allreduce_perf under tinyddp-run prints nccl-tests' table with no wrong element") {
  const std::string bin = TINYDDP_BIN_DIR;
  struct stat st {};
  if (::stat((bin + "/allreduce_perf").c_str(), &st) != 0 || ::stat((bin + "/tinyddp-run").c_str(), &st) != 0) {
    MESSAGE("skipped: build allreduce_perf and tinyddp-run first (cmake --build BUILD --target allreduce_perf tinyddp-run)");
    return;
  }
  for (std::string transport : {"shm", "tcp"}) {
    CAPTURE(transport);
    auto outcome = finish_child(spawn_program({bin + "/tinyddp-run", "-n", "2", bin + "/allreduce_perf", "-b", "1K", "-e",
                                               "1M", "-f", "32", "-n", "3", "-w", "1", "-d", "int32", "-o", "max",
                                               "--transport", transport}),
                                60s);
    CHECK_MESSAGE(outcome.ok(), outcome.describe());
    const std::string& out = outcome.report;
    CHECK_MESSAGE(out.find("out-of-place") != std::string::npos, out);
    CHECK(out.find("#wrong") != std::string::npos);
    CHECK(out.find("      1024           256    int32    max    -1") != std::string::npos);
    CHECK(out.find("     32768          8192    int32    max    -1") != std::string::npos);
    CHECK(out.find("# Out of bounds values : 0 OK") != std::string::npos);
    CHECK(out.find("# Avg bus bandwidth    : ") != std::string::npos);
  }
}
