// A peer process killed in the middle of a collective: every surviving rank must raise an error
// naming it within seconds (socket EOF for tcp, pid checks for shm), far sooner than the
// collective's timeout. Real processes (fork), a real TcpStore, SIGKILL: nothing can say goodbye.
#include <doctest/doctest.h>

#include <csignal>
#include <thread>

#include "tinyddp/comm/process_group.h"
#include "tinyddp/comm/store/tcp_store.h"
#include "test/comm/helpers/child_process.h"

using namespace tinyddp;
using namespace tinyddp::comm;
using namespace tinyddp::testing;
using namespace std::chrono_literals;

namespace {

constexpr int kWorld = 4;
constexpr int kVictim = 2;

// One rank: all-reduces 4 MiB again and again; the victim SIGKILLs itself 300 ms in. A survivor
// exits 0 when its error names the victim (and says how long detection took), 3 when it names
// someone else, 4 when no error came at all.
int run_rank(int rank, int port, const std::string& transport, std::string& report) {
  TcpStoreOptions store_options;
  store_options.timeout = 20s;
  auto store = std::make_shared<TcpStore>("127.0.0.1", port, false, store_options);
  ProcessGroupOptions options;
  options.transport = transport;
  options.timeout = 120s;  // far beyond the test's deadline: detection must not come from the timeout
  options.group_name = "failure-" + transport;
  auto pg = create_process_group("host", store, rank, kWorld, options);
  Tensor t = Tensor::zeros({1 << 20});
  pg->barrier()->wait();
  if (rank == kVictim) {
    std::thread([] {
      std::this_thread::sleep_for(300ms);
      std::raise(SIGKILL);
    }).detach();
  }
  auto start = std::chrono::steady_clock::now();
  try {
    for (;;) {
      pg->all_reduce(t)->wait();
      if (std::chrono::steady_clock::now() - start > 15s) return 4;
    }
  } catch (const std::exception& e) {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
    report = "after " + std::to_string(ms) + " ms: " + e.what();
    // The error must name the victim as a rank ("rank 2" or "rank(s) 2").
    bool names = report.find("rank " + std::to_string(kVictim) + " ") != std::string::npos ||
                 report.find("rank " + std::to_string(kVictim) + "'") != std::string::npos ||
                 report.find("rank(s) " + std::to_string(kVictim)) != std::string::npos;
    return names ? 0 : 3;
  }
}

void kill_one_rank(const std::string& transport) {
  TINYDDP_SKIP_UNDER_TSAN();  // the ranks are spawn_child lambdas: forked, no exec
  TcpStoreOptions server_options;
  server_options.timeout = 20s;
  TcpStore server("127.0.0.1", 0, true, server_options);
  std::vector<Child> children;
  for (int r = 0; r < kWorld; ++r)
    children.push_back(spawn_child([&, r](std::string& report) { return run_rank(r, server.port(), transport, report); }));
  auto deadline = Clock::now() + 40s;
  for (int r = 0; r < kWorld; ++r) {
    ChildOutcome outcome = finish_child(children[size_t(r)], deadline);
    if (r == kVictim) {
      CHECK_MESSAGE(outcome.signal == SIGKILL, "the victim: ", outcome.describe());
    } else {
      CHECK_MESSAGE(outcome.ok(), "rank ", r, " over ", transport, ": ", outcome.describe());
      MESSAGE("rank " << r << " over " << transport << ": " << outcome.report.substr(0, 400));
    }
  }
}

}  // namespace

TEST_CASE("a peer killed mid-collective is named by every survivor, over tcp") { kill_one_rank("tcp"); }

TEST_CASE("a peer killed mid-collective is named by every survivor, over shared memory") { kill_one_rank("shm"); }
