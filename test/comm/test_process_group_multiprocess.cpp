// Real processes: init_process_group over tcp:// (rank 0 hosting the store). The benchmark programs
// under tinyddp-run are tested in test/bench.
#include <doctest/doctest.h>

#include <sched.h>

#include "tinyddp/comm/host_backend.h"
#include "tinyddp/comm/process_group.h"
#include "test/comm/helpers/child_process.h"

using namespace tinyddp;
using namespace tinyddp::comm;
using namespace tinyddp::testing;
using namespace std::chrono_literals;

TEST_CASE("init_process_group over tcp:// joins 3 processes that then all-reduce") {
  TINYDDP_SKIP_UNDER_TSAN();  // the ranks are spawn_child lambdas: forked, no exec
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

TEST_CASE("ranks bound to CPUs of their own know no peer shares them; ranks on one CPU know they do") {
  // A rank running its own collective yields its core between looks at its peers only when a peer
  // may run on it: yielding costs a system call, and spinning against a peer on one's own CPU stops it.
  cpu_set_t allowed;
  REQUIRE(sched_getaffinity(0, sizeof allowed, &allowed) == 0);
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  if (cpus.size() < 2) TINYDDP_SKIP("needs two CPUs to bind two ranks apart");
  TINYDDP_SKIP_UNDER_TSAN();
  for (bool apart : {true, false}) {
    CAPTURE(apart);
    const int port = free_loopback_port();
    std::vector<Child> children;
    for (int r = 0; r < 2; ++r) {
      const int cpu = apart ? cpus[size_t(r)] : cpus[0];
      children.push_back(spawn_child([&, r, cpu](std::string& report) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(cpu, &one);
        if (sched_setaffinity(0, sizeof one, &one) != 0) return 2;
        ProcessGroupOptions options;
        options.transport = "shm";
        options.timeout = 30s;
        auto pg = init_process_group("host", "tcp://127.0.0.1:" + std::to_string(port), r, 2, options);
        const Tensor mine = Tensor::from_vector(std::vector<float>(256, float(r + 1)));
        Tensor t = Tensor::empty({256});
        for (int i = 0; i < 100; ++i) pg->all_reduce_into(t, mine)->wait();  // a blocking caller's loop
        pg->barrier()->wait();
        const bool shares = dynamic_cast<HostBackend&>(*pg).shares_cpus_with_peers();
        const bool ok = shares == !apart && t.to_vector<float>().front() == 3.0f;
        if (!ok)
          report = "rank " + std::to_string(r) + ": shares " + std::to_string(shares) + ", sum " +
                   std::to_string(t.to_vector<float>().front());
        return ok ? 0 : 1;
      }));
    }
    auto deadline = Clock::now() + 60s;
    for (int r = 0; r < 2; ++r) {
      auto outcome = finish_child(children[size_t(r)], deadline);
      CHECK_MESSAGE(outcome.ok(), "rank ", r, ": ", outcome.describe());
    }
  }
}
