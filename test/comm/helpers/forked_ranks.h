// Ranks as forked processes that meet through a TcpStore served by the test: the shape of the fault
// tests, where a rank is killed and the others must name it.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "tinyddp/comm/store/tcp_store.h"
#include "test/comm/helpers/child_process.h"

namespace tinyddp::testing {

// Forks `world` children; child r runs rank(r, port, report) with the store's port and exits with its
// result. Returns how each ended, in rank order, all within `timeout` (an overrunning child is killed).
inline std::vector<ChildOutcome> run_forked_ranks(int world, const std::function<int(int, int, std::string&)>& rank,
                                                  std::chrono::seconds timeout = std::chrono::seconds(40)) {
  comm::TcpStoreOptions server_options;
  server_options.timeout = std::chrono::seconds(20);
  comm::TcpStore server("127.0.0.1", 0, true, server_options);
  std::vector<Child> children;
  for (int r = 0; r < world; ++r)
    children.push_back(spawn_child([&, r](std::string& report) { return rank(r, server.port(), report); }));
  const auto deadline = Clock::now() + timeout;
  std::vector<ChildOutcome> outcomes;
  for (int r = 0; r < world; ++r) outcomes.push_back(finish_child(children[size_t(r)], deadline));
  return outcomes;
}

}  // namespace tinyddp::testing
