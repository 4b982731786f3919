// Rendezvous: init_method parsing, the launchers' environment variables, 4 processes joining by
// tcp:// and by env://, and the errors a badly started job must report.
#include <doctest/doctest.h>

#include <map>

#include "tinyddp/comm/store/barrier.h"
#include "tinyddp/comm/store/rendezvous.h"
#include "tinyddp/comm/store/store_server.h"
#include "tinyddp/comm/store/tcp_store.h"
#include "tinyddp/core/error.h"
#include "test/comm/helpers/child_process.h"

using namespace tinyddp;
using namespace tinyddp::comm;
using namespace std::chrono_literals;
using namespace tinyddp::testing;

namespace {

using Variables = std::map<std::string, std::string>;

EnvironmentLookup lookup_in(Variables variables) {
  return [variables = std::move(variables)](const std::string& name) -> std::optional<std::string> {
    auto it = variables.find(name);
    if (it == variables.end()) return std::nullopt;
    return it->second;
  };
}

// What each rank of a successful job checks: everyone sees everyone's key through the store it got,
// a barrier passes, and the ranks it reports are the ones it was given.
int check_joined(const Rendezvous& r, int expected_rank, int world_size, std::string& report) {
  if (r.rank != expected_rank || r.world_size != world_size) {
    report = "got rank " + std::to_string(r.rank) + " of " + std::to_string(r.world_size);
    return 2;
  }
  r.store->set("hello/" + std::to_string(r.rank), "from " + std::to_string(r.rank));
  StoreBarrier(*r.store, r.rank, r.world_size, "after-hello").arrive_and_wait(20s);
  for (int i = 0; i < world_size; ++i) {
    if (!r.store->check({"hello/" + std::to_string(i)})) {
      report = "rank " + std::to_string(r.rank) + " passed the barrier before rank " + std::to_string(i) +
               " said hello";
      return 3;
    }
  }
  // The rank hosting the store stays until everyone is done with it.
  StoreBarrier(*r.store, r.rank, r.world_size, "done").arrive_and_wait(20s);
  if (r.rank == 0 && r.tcp_store->is_master()) {
    std::vector<std::string> left;
    for (int i = 1; i < world_size; ++i) left.push_back("left/" + std::to_string(i));
    r.store->wait(left, 20s);
  } else {
    r.store->set("left/" + std::to_string(r.rank), "1");
  }
  return 0;
}

void require_all_ok(std::vector<Child>& children, std::chrono::seconds timeout = 60s) {
  auto deadline = Clock::now() + timeout;
  for (size_t i = 0; i < children.size(); ++i) {
    ChildOutcome outcome = finish_child(children[i], deadline);
    CHECK_MESSAGE(outcome.ok(), "rank ", i, ": ", outcome.describe());
  }
}

std::string message_of(const ChildOutcome& outcome) { return outcome.report; }

}  // namespace

TEST_CASE("init_method strings") {
  CHECK(InitMethod::parse("env://").kind == InitMethod::Kind::env);
  InitMethod tcp = InitMethod::parse("tcp://localhost:12355");
  CHECK(tcp.kind == InitMethod::Kind::tcp);
  CHECK(tcp.host == "localhost");
  CHECK(tcp.port == 12355);
  InitMethod v6 = InitMethod::parse("tcp://[::1]:29500");
  CHECK(v6.host == "::1");
  CHECK(v6.port == 29500);
  CHECK_THROWS_WITH_AS(InitMethod::parse("file:///tmp/x"), doctest::Contains("is not understood; hint:"), Error);
  CHECK_THROWS_WITH_AS(InitMethod::parse("tcp://localhost"), doctest::Contains("names no port"), Error);
  CHECK_THROWS_WITH_AS(InitMethod::parse("tcp://host:http"), doctest::Contains("port 'http' is not a port number"),
                       Error);
  CHECK_THROWS_WITH_AS(InitMethod::parse("tcp://host:0"), doctest::Contains("is not a port number 1..65535"), Error);
  CHECK_THROWS_WITH_AS(InitMethod::parse("tcp://host:70000"), doctest::Contains("is not a port number"), Error);
}

TEST_CASE("the launchers' environment variables, in order of precedence") {
  SUBCASE("tinyddp-run / torchrun") {
    auto env = read_launch_environment(lookup_in({{"RANK", "5"},
                                                  {"WORLD_SIZE", "8"},
                                                  {"LOCAL_RANK", "1"},
                                                  {"LOCAL_WORLD_SIZE", "4"},
                                                  {"MASTER_ADDR", "node0"},
                                                  {"MASTER_PORT", "29500"},
                                                  {"TINYDDP_RESTART_COUNT", "2"},
                                                  {"TINYDDP_RUN_ID", "job7"},
                                                  {"TINYDDP_LAUNCHER_STORE", "1"},
                                                  // a launcher inside a Slurm allocation: RANK wins
                                                  {"SLURM_PROCID", "0"},
                                                  {"SLURM_NTASKS", "2"}}));
    CHECK(env.rank == 5);
    CHECK(env.world_size == 8);
    CHECK(env.local_rank == 1);
    CHECK(env.local_world_size == 4);
    CHECK(env.master_addr == "node0");
    CHECK(env.master_port == 29500);
    CHECK(env.restart_count == 2);
    CHECK(env.run_id == "job7");
    CHECK(env.launcher_store);
    CHECK(env.source == "RANK/WORLD_SIZE");
  }
  SUBCASE("Slurm's srun") {
    auto env = read_launch_environment(lookup_in(
        {{"SLURM_PROCID", "6"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "2"}, {"SLURM_NTASKS_PER_NODE", "4(x2)"}}));
    CHECK(env.rank == 6);
    CHECK(env.world_size == 8);
    CHECK(env.local_rank == 2);
    CHECK(env.local_world_size == 4);
    CHECK(env.source.find("Slurm") == 0);
  }
  SUBCASE("Open MPI's mpirun") {
    auto env = read_launch_environment(lookup_in({{"OMPI_COMM_WORLD_RANK", "3"},
                                                  {"OMPI_COMM_WORLD_SIZE", "4"},
                                                  {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                                  {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}));
    CHECK(env.rank == 3);
    CHECK(env.world_size == 4);
    CHECK(env.local_rank == 1);
    CHECK(env.local_world_size == 2);
    CHECK(env.source.find("Open MPI") == 0);
  }
  SUBCASE("nothing set, and one node assumed when the local variables are missing") {
    auto none = read_launch_environment(lookup_in({}));
    CHECK(none.rank == -1);
    CHECK(none.world_size == -1);
    CHECK(none.run_id == "default");
    auto single = read_launch_environment(lookup_in({{"RANK", "2"}, {"WORLD_SIZE", "3"}}));
    CHECK(single.local_rank == 2);
    CHECK(single.local_world_size == 3);
  }
  SUBCASE("values that make no sense are errors that name the variable") {
    CHECK_THROWS_WITH_AS(read_launch_environment(lookup_in({{"RANK", "one"}, {"WORLD_SIZE", "2"}})),
                         doctest::Contains("RANK='one' is not an integer"), Error);
    CHECK_THROWS_WITH_AS(read_launch_environment(lookup_in({{"RANK", "1"}})),
                         doctest::Contains("RANK is set but WORLD_SIZE is not"), Error);
    CHECK_THROWS_WITH_AS(read_launch_environment(lookup_in({{"RANK", "4"}, {"WORLD_SIZE", "4"}})),
                         doctest::Contains("RANK=4 is not below WORLD_SIZE=4"), Error);
    CHECK_THROWS_WITH_AS(read_launch_environment(lookup_in({{"MASTER_PORT", "99999"}})),
                         doctest::Contains("MASTER_PORT=99999 is not a port"), Error);
  }
}

TEST_CASE("env:// without MASTER_ADDR/PORT, or without a rank, says what to set") {
  RendezvousOptions options;
  options.environment = lookup_in({{"RANK", "0"}, {"WORLD_SIZE", "2"}});
  CHECK_THROWS_WITH_AS(rendezvous("env://", options), doctest::Contains("MASTER_ADDR and MASTER_PORT must name"),
                       Error);
  options.environment = lookup_in({{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "1234"}});
  CHECK_THROWS_WITH_AS(rendezvous("env://", options), doctest::Contains("rank and world size are unknown"), Error);
}

TEST_CASE("4 processes rendezvous by tcp://, rank 0 hosting the store") {
  TINYDDP_SKIP_UNDER_TSAN();
  int port = free_loopback_port();
  std::string init = "tcp://127.0.0.1:" + std::to_string(port);
  std::vector<Child> children;
  for (int rank = 0; rank < 4; ++rank)
    children.push_back(spawn_child([&, rank](std::string& report) {
      RendezvousOptions options;
      options.rank = rank;
      options.world_size = 4;
      options.timeout = 30s;
      options.token = "";
      options.environment = lookup_in({});
      Rendezvous r = rendezvous(init, options);
      if (r.tcp_store->is_master() != (rank == 0)) return report = "the wrong rank hosts the store", 4;
      return check_joined(r, rank, 4, report);
    }));
  require_all_ok(children);
}

TEST_CASE("4 processes rendezvous by env://, with each launcher's variables") {
  TINYDDP_SKIP_UNDER_TSAN();
  struct Family {
    const char *rank, *world_size, *local_rank;
  };
  for (Family family :
       {Family{"RANK", "WORLD_SIZE", "LOCAL_RANK"}, Family{"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
        Family{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"}}) {
    CAPTURE(family.rank);
    int port = free_loopback_port();
    std::vector<Child> children;
    for (int rank = 0; rank < 4; ++rank)
      children.push_back(spawn_child([&, rank](std::string& report) {
        // The real process environment, as a launcher would leave it.
        for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
                                 "OMPI_COMM_WORLD_RANK", "TINYDDP_LAUNCHER_STORE", "TINYDDP_TOKEN"})
          unsetenv(name);
        setenv(family.rank, std::to_string(rank).c_str(), 1);
        setenv(family.world_size, "4", 1);
        setenv(family.local_rank, std::to_string(rank).c_str(), 1);
        setenv("MASTER_ADDR", "127.0.0.1", 1);
        setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
        RendezvousOptions options;
        options.timeout = 30s;
        Rendezvous r = rendezvous("env://", options);
        if (r.local_rank != rank || r.local_world_size != 4) return report = "wrong local rank", 4;
        return check_joined(r, rank, 4, report);
      }));
    require_all_ok(children);
  }
}

// The error cases below use a store hosted outside the ranks (as under tinyddp-run), so that every
// rank, rank 0 included, can be made to misbehave.
namespace {
struct ExternalStore {
  StoreServer server{[] {
    StoreServerOptions o;
    o.host = "127.0.0.1";
    return o;
  }()};
  RendezvousOptions options(int rank, int world_size, std::chrono::milliseconds timeout = 20s) {
    RendezvousOptions o;
    o.rank = rank;
    o.world_size = world_size;
    o.timeout = timeout;
    o.token = "";
    o.environment = lookup_in({{"TINYDDP_LAUNCHER_STORE", "1"}});
    return o;
  }
  std::string init() { return "tcp://127.0.0.1:" + std::to_string(server.port()); }
};
}  // namespace

TEST_CASE("rendezvous errors: two processes claim one rank") {
  TINYDDP_SKIP_UNDER_TSAN();
  ExternalStore store;
  auto first = spawn_child([&](std::string&) {
    rendezvous(store.init(), store.options(1, 3, 3s));
    return 0;
  });
  TcpStore watcher("127.0.0.1", store.server.port(), false, [] {
    TcpStoreOptions o;
    o.token = "";
    return o;
  }());
  watcher.wait({"tinyddp/default/0/rdzv/rank/1"}, 20s);
  auto second = finish_child(spawn_child([&](std::string&) {
                               rendezvous(store.init(), store.options(1, 3, 3s));
                               return 0;
                             }),
                             30s);
  CHECK(second.exit_code == 99);
  CHECK_MESSAGE(message_of(second).find("rank 1 is claimed by two processes") != std::string::npos, second.report);
  CHECK(message_of(second).find("pid") != std::string::npos);
  CHECK(message_of(second).find("; hint: every process needs its own RANK") != std::string::npos);
  // The first one does not wait out its timeout for ranks that will never come: it fails within a
  // slice of its wait, naming the two processes.
  auto first_outcome = finish_child(first, 30s);
  CHECK(first_outcome.exit_code == 99);
  CHECK_MESSAGE(first_outcome.report.find("a process was refused: rank 1 is claimed by two processes") !=
                    std::string::npos,
                first_outcome.report);
  CHECK(first_outcome.report.find("pid") != std::string::npos);
}

TEST_CASE("rendezvous errors: world sizes differ") {
  TINYDDP_SKIP_UNDER_TSAN();
  ExternalStore store;
  auto first = spawn_child([&](std::string&) {
    rendezvous(store.init(), store.options(0, 2, 2s));
    return 0;
  });
  TcpStore watcher("127.0.0.1", store.server.port(), false, [] {
    TcpStoreOptions o;
    o.token = "";
    return o;
  }());
  watcher.wait({"tinyddp/default/0/rdzv/world_size"}, 20s);
  auto second = finish_child(spawn_child([&](std::string&) {
                               rendezvous(store.init(), store.options(1, 3, 2s));
                               return 0;
                             }),
                             30s);
  // Every rank's message names the offender and what differs, the refused one's and the waiting one's.
  CHECK(second.exit_code == 99);
  CHECK_MESSAGE(second.report.find("world size mismatch: rank 1 (") != std::string::npos, second.report);
  CHECK_MESSAGE(second.report.find(") has WORLD_SIZE=3, but rank 0 (") != std::string::npos, second.report);
  CHECK(second.report.find(") has WORLD_SIZE=2") != std::string::npos);
  auto first_outcome = finish_child(first, 30s);
  CHECK(first_outcome.exit_code == 99);
  CHECK_MESSAGE(first_outcome.report.find("a process was refused: rank 1 (") != std::string::npos,
                first_outcome.report);
  CHECK(first_outcome.report.find("has WORLD_SIZE=3, but rank 0 (") != std::string::npos);
  CHECK(first_outcome.report.find("joined after") == std::string::npos);  // not called "missing"
}

TEST_CASE("rendezvous errors: a rank that never comes is named after the timeout") {
  TINYDDP_SKIP_UNDER_TSAN();
  ExternalStore store;
  std::vector<Child> children;
  for (int rank : {0, 1, 3})
    children.push_back(spawn_child([&, rank](std::string&) {
      rendezvous(store.init(), store.options(rank, 4, 1500ms));
      return 0;
    }));
  for (auto& child : children) {
    auto outcome = finish_child(child, 30s);
    CHECK(outcome.exit_code == 99);
    CHECK_MESSAGE(outcome.report.find("3/4 ranks joined after 1.") != std::string::npos, outcome.report);
    CHECK(outcome.report.find("s; missing: rank 2; hint:") != std::string::npos);
    CHECK(outcome.report.find("TINYDDP_TIMEOUT=<seconds>") != std::string::npos);
  }
}

TEST_CASE("rendezvous errors: the master is unreachable, or its port is taken") {
  int port = free_loopback_port();
  RendezvousOptions options;
  options.rank = 1;
  options.world_size = 2;
  options.timeout = 500ms;
  options.environment = lookup_in({});
  try {
    rendezvous("tcp://127.0.0.1:" + std::to_string(port), options);
    FAIL("joined a job with no master");
  } catch (const Error& e) {
    std::string m = e.message();
    CHECK(m.find("rendezvous at tcp://127.0.0.1:" + std::to_string(port)) == 0);
    CHECK(m.find("rank 1 of 2") != std::string::npos);
    CHECK(m.find("could not connect to the store at 127.0.0.1:" + std::to_string(port) + ": gave up after 0.") !=
          std::string::npos);
  }
  ExternalStore taken;
  options.rank = 0;
  options.timeout = 5s;
  CHECK_THROWS_WITH_AS(rendezvous(taken.init(), options),
                       doctest::Contains(
                           ("port " + std::to_string(taken.server.port()) + " on 127.0.0.1 is already in use").c_str()),
                       Error);
}
