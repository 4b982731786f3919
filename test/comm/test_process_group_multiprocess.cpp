// Real processes: init_process_group over tcp:// (rank 0 hosting the store). The benchmark programs
// under tinyddp-run are tested in test/bench.
#include <doctest/doctest.h>

#include "tinyddp/comm/process_group.h"
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
        auto pg = init_process_group("host", "tcp://127.0.0.1:" + std::to_string(port), r, world, options);
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
