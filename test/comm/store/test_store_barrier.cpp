// StoreBarrier across processes: 8 ranks pass several barriers in step, and a missing rank is named.
#include <doctest/doctest.h>

#include "tinyddp/comm/store/barrier.h"
#include "tinyddp/comm/store/prefix_store.h"
#include "tinyddp/comm/store/tcp_store.h"
#include "tinyddp/core/error.h"
#include "test/comm/helpers/child_process.h"

using namespace tinyddp;
using namespace tinyddp::comm;
using namespace std::chrono_literals;
using namespace tinyddp::testing;

namespace {
TcpStoreOptions options(std::chrono::milliseconds timeout = 20s) {
  TcpStoreOptions o;
  o.timeout = timeout;
  o.token = "";
  return o;
}
}  // namespace

TEST_CASE("a barrier of 8 processes: nobody passes generation g before everyone reached it") {
  TINYDDP_SKIP_UNDER_TSAN();
  TcpStore master("127.0.0.1", 0, true, options());
  constexpr int kRanks = 8, kRounds = 5;
  std::vector<Child> children;
  for (int rank = 0; rank < kRanks; ++rank)
    children.push_back(spawn_child([&, rank](std::string& report) {
      TcpStore store("127.0.0.1", master.port(), false, options());
      StoreBarrier barrier(store, rank, kRanks, "steps");
      for (int round = 0; round < kRounds; ++round) {
        store.set("round/" + std::to_string(round) + "/" + std::to_string(rank), "here");
        barrier.arrive_and_wait(20s);
        // Past the barrier, every rank's key for this round must exist.
        for (int other = 0; other < kRanks; ++other)
          if (!store.check({"round/" + std::to_string(round) + "/" + std::to_string(other)})) {
            report = "round " + std::to_string(round) + ": passed before rank " + std::to_string(other) + " arrived";
            return 1;
          }
      }
      return barrier.generation() == kRounds ? 0 : 2;
    }));
  auto deadline = Clock::now() + 60s;
  for (int rank = 0; rank < kRanks; ++rank) {
    auto outcome = finish_child(children[rank], deadline);
    CHECK_MESSAGE(outcome.ok(), "rank ", rank, ": ", outcome.describe());
  }
  // Old generations are cleaned up as the barrier moves on: only the last one's keys remain.
  CHECK(master.check({"steps/4/done"}));
  CHECK_FALSE(master.check({"steps/2/done"}));
  CHECK_FALSE(master.check({"steps/0/count"}));
}

TEST_CASE("a barrier that times out names the ranks that did not arrive") {
  TINYDDP_SKIP_UNDER_TSAN();
  TcpStore master("127.0.0.1", 0, true, options());
  PrefixStore job(master, "job");
  std::vector<Child> children;
  for (int rank : {0, 2})
    children.push_back(spawn_child([&, rank](std::string&) {
      TcpStore store("127.0.0.1", master.port(), false, options());
      StoreBarrier(store, rank, 4, "sync").arrive_and_wait(800ms);
      return 0;
    }));
  for (auto& child : children) {
    auto outcome = finish_child(child, 30s);
    CHECK(outcome.exit_code == 99);
    CHECK_MESSAGE(outcome.report.find("barrier 'sync' (generation 0): 2/4 ranks arrived after 0.") != std::string::npos,
                  outcome.report);
    CHECK(outcome.report.find("missing: ranks 1, 3; hint:") != std::string::npos);
  }
  CHECK_THROWS_WITH_AS(StoreBarrier(job, 4, 4), doctest::Contains("rank 4 with world size 4"), Error);
}
