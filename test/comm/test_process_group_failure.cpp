// A peer process killed in the middle of a collective: every surviving rank must raise an error
// naming it within seconds (socket EOF for tcp, pid checks for shm), far sooner than the
// collective's timeout. Real processes (fork), a real TcpStore, SIGKILL: nothing can say goodbye.
#include <doctest/doctest.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <regex>
#include <set>
#include <thread>

#include "tinyddp/comm/host_backend.h"
#include "tinyddp/comm/process_group.h"
#include "tinyddp/comm/store/tcp_store.h"
#include "tinyddp/comm/tuning.h"
#include "tinyddp/core/process.h"
#include "test/comm/helpers/forked_ranks.h"

using namespace tinyddp;
using namespace tinyddp::comm;
using namespace tinyddp::testing;
using namespace std::chrono_literals;

namespace {

constexpr int kWorld = 4;
constexpr int kVictim = 2;

// Every rank in the lists of "rank 2", "ranks 1, 3" or "rank(s) 2, 3" that `pattern` (with the list
// as its first group) finds in `message`.
std::set<int> ranks_in(const std::string& message, const std::regex& pattern) {
  static const std::regex number("[0-9]+");
  std::set<int> ranks;
  for (std::sregex_iterator m(message.begin(), message.end(), pattern), end; m != end; ++m) {
    const std::string list = (*m)[1];
    for (std::sregex_iterator n(list.begin(), list.end(), number); n != end; ++n) ranks.insert(std::stoi(n->str()));
  }
  return ranks;
}

// The ranks an error message says died: "rank(s) 2, 3 died" (tcp), "rank 2 (pid 123) died" (shm).
// Other ranks may be named for other reasons: a fellow survivor that relays its own failure ("rank 3
// aborted: rank 3 failed: <why>"), or one that hung up after it failed (tcp cannot tell an abort's
// hang-up from a death's, and says "closed their connections").
std::set<int> ranks_said_dead(const std::string& message) {
  static const std::regex died(R"(\brank(?:s|\(s\))? ([0-9]+(?:, [0-9]+)*)(?: \(pid [0-9]+\))? died)");
  return ranks_in(message, died);
}

// Every rank the message names at all.
std::set<int> ranks_named(const std::string& message) {
  static const std::regex named(R"(\brank(?:s|\(s\))? ([0-9]+(?:, [0-9]+)*))");
  return ranks_in(message, named);
}

// A survivor's verdict: the victim named, and no other rank said to have died.
bool names_exactly_the_victim(const std::string& message) {
  const std::set<int> dead = ranks_said_dead(message);
  return ranks_named(message).count(kVictim) == 1 && (dead.empty() || dead == std::set<int>{kVictim});
}

// One rank: all-reduces `elements` floats again and again; the victim SIGKILLs itself 300 ms in. A survivor
// exits 0 when its error names the victim and says no other rank died (and says how long detection
// took), 3 otherwise, 4 when no error came at all. It stays alive until every survivor has its error
// (or 20 s pass), so that no survivor sees another gone and rightly calls it dead. A survivor whose
// calls did not take the `path` asked for exits 5.
enum class Path {
  as_chosen,     // whatever the group chooses for the size
  fifos,         // through the shared-memory fifos (TINYDDP_STAGING=0, TINYDDP_CROSS_MEMORY=0)
  staged,        // through the staging (staged_all_reduce.h)
  cross_memory,  // through the kernel (cross_memory_all_reduce.h), where ptrace permission allows it
};
int run_rank(int rank, int port, const std::string& transport, int64_t elements, Path path, std::string& report) {
  TcpStoreOptions store_options;
  store_options.timeout = 20s;
  auto store = std::make_shared<TcpStore>("127.0.0.1", port, false, store_options);
  ProcessGroupOptions options;
  options.transport = transport;
  options.timeout = 120s;  // far beyond the test's deadline: detection must not come from the timeout
  options.group_name = "failure-" + transport + "-" + std::to_string(elements);
  if (path == Path::fifos) {
    ::setenv("TINYDDP_STAGING", "0", 1);  // this forked rank's own environment
    ::setenv("TINYDDP_CROSS_MEMORY", "0", 1);
  }
  auto pg = create_process_group("host", store, rank, kWorld, options);
  Tensor t = Tensor::zeros({elements});
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
    const bool right = names_exactly_the_victim(e.what());
    const HostBackend& host = dynamic_cast<HostBackend&>(*pg);
    if (path == Path::staged && host.staged_collectives() == 0) return 5;
    if (path == Path::cross_memory && host.cross_memory_enabled() && host.cross_memory_collectives() == 0) return 5;
    if (path == Path::fifos && host.staged_collectives() + host.cross_memory_collectives() != 0) return 5;
    const int64_t reported = store->add(options.group_name + "/reported", 1);
    for (auto give_up = std::chrono::steady_clock::now() + 20s;
         reported < kWorld - 1 && store->add(options.group_name + "/reported", 0) < kWorld - 1 &&
         std::chrono::steady_clock::now() < give_up;)
      std::this_thread::sleep_for(10ms);
    return right ? 0 : 3;
  }
}

void kill_one_rank(const std::string& transport, int64_t elements = 1 << 20, Path path = Path::as_chosen) {
  TINYDDP_SKIP_UNDER_TSAN();  // the ranks are spawn_child lambdas: forked, no exec
  const auto outcomes = run_forked_ranks(kWorld, [&](int r, int port, std::string& report) {
    return run_rank(r, port, transport, elements, path, report);
  });
  for (int r = 0; r < kWorld; ++r) {
    const ChildOutcome& outcome = outcomes[size_t(r)];
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

TEST_CASE("a peer killed mid-collective is named by every survivor, over the shared-memory fifos") {
  kill_one_rank("shm", 1 << 20, Path::fifos);
}

// 1 MiB: staged through symmetric memory (staged_all_reduce.h), below the size process_vm_readv takes;
// the survivors wait at the staging's barriers, not on a fifo.
TEST_CASE("a peer killed mid-collective is named by every survivor, in a staged all-reduce") {
  kill_one_rank("shm", 1 << 18, Path::staged);
}

// 4 MiB: through the kernel where ptrace permission allows it; a survivor finds the victim gone in a
// barrier or when process_vm_readv/writev can no longer reach its memory.
TEST_CASE("a peer killed mid-collective is named by every survivor, in an all-reduce through the kernel") {
  static_assert((1 << 20) * sizeof(float) >= tuning::kCrossMemoryDefaultBytes);
  kill_one_rank("shm", 1 << 20, Path::cross_memory);
}

TEST_CASE("the survivors' check: a message that says another rank died too does not pass") {
  CHECK_FALSE(
      names_exactly_the_victim("tcp transport: connection from rank 1 to rank 0 broke: ...; rank(s) 2, 3 died (the "
                               "process is gone); rank(s) 2, 3, 0 closed their connections"));
  CHECK_FALSE(names_exactly_the_victim("shm transport: rank 3 (pid 7) died while rank 0 was in a collective with it"));
  CHECK_FALSE(names_exactly_the_victim("tcp transport: rank(s) 0 closed their connections"));
  CHECK(
      names_exactly_the_victim("shm transport: rank 3 aborted: rank 3 failed: shm transport: rank 2 (pid 7) died while "
                               "rank 3 was in a collective with it; hint: look at rank 3's own output"));
  CHECK(names_exactly_the_victim(
      "tcp transport: connection from rank 3 to rank 2 broke: ...; rank(s) 2 closed their connections"));
  CHECK(names_exactly_the_victim(
      "tcp transport: ...; rank(s) 2 died (the process is gone); rank(s) 2, 0 closed their connections"));
}

TEST_CASE("a peer that passes a barrier and exits at once is not taken for dead by a rank still waking in it") {
  TINYDDP_SKIP_UNDER_TSAN();  // forked ranks
  // Rank 1 goes to sleep in a barrier; rank 0 stops it (SIGSTOP), arrives, passes, and exits at once;
  // a helper process continues rank 1 only once rank 0 is dead. Rank 1 then wakes to a peer that is
  // gone but had arrived: its barrier is complete, and nothing failed.
  const auto outcomes = run_forked_ranks(2, [&](int rank, int port, std::string& report) {
    ::setenv("TINYDDP_SPIN_US", "0", 1);  // waits sleep at once: rank 1 is asleep in the barrier when stopped
    TcpStoreOptions store_options;
    store_options.timeout = 20s;
    auto store = std::make_shared<TcpStore>("127.0.0.1", port, false, store_options);
    ProcessGroupOptions options;
    options.transport = "shm";
    options.timeout = 30s;
    options.group_name = "exit-after-barrier";
    auto pg = create_process_group("host", store, rank, 2, options);
    Tensor large = Tensor::zeros({1 << 16}), small = Tensor::zeros({16});
    pg->all_reduce(large)->wait();  // the fifos between the two are open
    pg->all_reduce(small)->wait();  // and the small messages' slots
    pg->barrier()->wait();
    if (rank == 1) {
      store->set("exit-after-barrier/pid1", std::to_string(::getpid()));
      try {
        pg->barrier()->wait();
      } catch (const std::exception& e) {
        report = e.what();
        return 3;
      }
      return 0;
    }
    const pid_t other = std::stoi(store->get("exit-after-barrier/pid1"));
    std::this_thread::sleep_for(200ms);  // rank 1 is in the barrier by now, asleep
    ::kill(other, SIGSTOP);
    const pid_t me = ::getpid();
    if (::fork() == 0) {
      for (auto give_up = std::chrono::steady_clock::now() + 20s;
           process_alive(me) && std::chrono::steady_clock::now() < give_up;)
        std::this_thread::sleep_for(1ms);
      ::kill(other, SIGCONT);
      ::_exit(0);
    }
    pg->barrier()->wait();  // rank 1 arrived before it was stopped: this passes at once
    ::_exit(0);             // at once, as a program whose last call was a barrier may
  });
  CHECK_MESSAGE(outcomes[0].ok(), outcomes[0].describe());
  CHECK_MESSAGE(outcomes[1].ok(), outcomes[1].describe());
}
