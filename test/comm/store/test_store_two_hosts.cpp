// Two hosts, really apart: two network namespaces joined by a veth pair, each with its own address
// (10.213.0.1 and 10.213.0.2) and its own loopback. The store runs in one, clients in the other, so
// nothing can accidentally go through 127.0.0.1. Needs root and `ip netns`; skips with a message
// otherwise. The namespaces are removed afterwards, also when a check fails.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include "tinyddp/comm/store/rendezvous.h"
#include "tinyddp/comm/store/tcp_store.h"
#include "tinyddp/core/error.h"
#include "test/comm/helpers/child_process.h"
#include "test/test_skip.h"

using namespace tinyddp;
using namespace tinyddp::comm;
using namespace std::chrono_literals;
using namespace tinyddp::testing;

namespace {

const std::string kBin = TINYDDP_BIN_DIR;
const std::string kAddressA = "10.213.0.1";
const std::string kAddressB = "10.213.0.2";

bool run_ip(const std::vector<std::string>& args, std::string* output = nullptr) {
  std::vector<std::string> argv = {"/usr/sbin/ip"};
  if (access(argv[0].c_str(), X_OK) != 0) argv[0] = "/sbin/ip";
  argv.insert(argv.end(), args.begin(), args.end());
  auto outcome = finish_child(spawn_program(argv), 20s);
  if (output) *output = outcome.report;
  return outcome.ok();
}

// Two namespaces "hosts" A and B, wired together; removed in the destructor.
struct TwoHosts {
  std::string a, b;
  bool ready = false;
  std::string why_not;

  TwoHosts() {
    std::string id = std::to_string(getpid());
    a = "tddp" + id + "a";
    b = "tddp" + id + "b";
    if (geteuid() != 0) {
      why_not = "not running as root";
      return;
    }
    if (!run_ip({"netns", "add", a}, &why_not)) return;
    std::string veth_a = "tdv" + id + "a", veth_b = "tdv" + id + "b";
    ready = run_ip({"netns", "add", b}, &why_not) &&
            run_ip({"link", "add", veth_a, "type", "veth", "peer", "name", veth_b}, &why_not) &&
            run_ip({"link", "set", veth_a, "netns", a}, &why_not) &&
            run_ip({"link", "set", veth_b, "netns", b}, &why_not) &&
            run_ip({"-n", a, "addr", "add", kAddressA + "/24", "dev", veth_a}, &why_not) &&
            run_ip({"-n", b, "addr", "add", kAddressB + "/24", "dev", veth_b}, &why_not) &&
            run_ip({"-n", a, "link", "set", veth_a, "up"}, &why_not) &&
            run_ip({"-n", b, "link", "set", veth_b, "up"}, &why_not) &&
            run_ip({"-n", a, "link", "set", "lo", "up"}, &why_not) &&
            run_ip({"-n", b, "link", "set", "lo", "up"}, &why_not);
  }
  ~TwoHosts() {
    // Deleting a namespace also deletes the veth end inside it, and with it the pair.
    run_ip({"netns", "delete", a});
    run_ip({"netns", "delete", b});
  }

  // In a forked child: move into namespace `name` (what `ip netns exec` does for the network).
  static bool enter(const std::string& name) {
    int fd = open(("/var/run/netns/" + name).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    bool ok = setns(fd, CLONE_NEWNET) == 0;
    close(fd);
    return ok;
  }
  std::vector<std::string> exec_in(const std::string& name, std::vector<std::string> argv) {
    argv.insert(argv.begin(), {"/usr/sbin/ip", "netns", "exec", name});
    if (access(argv[0].c_str(), X_OK) != 0) argv[0] = "/sbin/ip";
    return argv;
  }
};

// True when `address` is one of this (namespace's) host's own addresses: only then can we bind it.
bool is_local_address(const std::string& address) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  inet_pton(AF_INET, address.c_str(), &addr.sin_addr);
  bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  close(fd);
  return ok;
}

}  // namespace

TEST_CASE("two hosts: the store on one, clients on the other") {
  TINYDDP_SKIP_UNDER_TSAN();
  TwoHosts hosts;
  if (!hosts.ready) {
    TINYDDP_SKIP("network namespaces are not available (", hosts.why_not, "); this test needs root and `ip netns`");
  }

  SUBCASE("a standalone tinyddp-store on host A serves a client on host B") {
    Child store = spawn_program(hosts.exec_in(hosts.a, {kBin + "/tinyddp-store", "--host", kAddressA, "--port", "0"}),
                                {"TINYDDP_TOKEN=across-hosts"});
    std::string banner = read_until(store.out_fd, "listening on", 20s);
    REQUIRE_MESSAGE(!banner.empty(), "tinyddp-store did not start");
    int port = std::stoi(banner.substr(banner.rfind(':') + 1));
    auto client = finish_child(spawn_child([&](std::string& report) {
                                 if (!TwoHosts::enter(hosts.b)) return report = "setns failed", 2;
                                 if (!is_local_address(kAddressB) || is_local_address(kAddressA))
                                   return report = "not on host B's address", 3;
                                 TcpStoreOptions options;
                                 options.timeout = 20s;
                                 options.token = "across-hosts";
                                 TcpStore remote(kAddressA, port, false, options);
                                 remote.set("from-b", "hello across hosts");
                                 if (remote.get("from-b") != "hello across hosts") return 4;
                                 if (remote.add("n", 2) != 2) return 5;
                                 // The store is not on B's own loopback: it really is on the other host.
                                 options.timeout = 300ms;
                                 try {
                                   TcpStore local("127.0.0.1", port, false, options);
                                   return report = "reached the store through B's loopback", 6;
                                 } catch (const Error&) {}
                                 return 0;
                               }),
                               60s);
    CHECK_MESSAGE(client.ok(), client.describe());
    kill(store.pid, SIGTERM);
    auto stopped = finish_child(store, 20s);
    CHECK_MESSAGE(stopped.exit_code == 0, stopped.describe());
  }

  SUBCASE("rendezvous by tcp:// with rank 0 on host A and rank 1 on host B") {
    std::string init = "tcp://" + kAddressA + ":29400";
    std::vector<Child> ranks;
    for (int rank = 0; rank < 2; ++rank)
      ranks.push_back(spawn_child([&, rank](std::string& report) {
        if (!TwoHosts::enter(rank == 0 ? hosts.a : hosts.b)) return report = "setns failed", 2;
        RendezvousOptions options;
        options.rank = rank;
        options.world_size = 2;
        options.timeout = 30s;
        options.token = "";
        options.environment = [](const std::string&) { return std::nullopt; };
        Rendezvous r = rendezvous(init, options);
        r.store->set("address/" + std::to_string(rank), rank == 0 ? kAddressA : kAddressB);
        std::string other = r.store->get("address/" + std::to_string(1 - rank));
        if (other != (rank == 0 ? kAddressB : kAddressA)) return report = "saw " + other, 3;
        // Rank 0 hosts the store: it stays until rank 1 is done with it.
        if (rank == 0)
          r.store->wait({"done/1"}, 30s);
        else
          r.store->set("done/1", "1");
        return 0;
      }));
    for (int rank = 0; rank < 2; ++rank) {
      auto outcome = finish_child(ranks[rank], 60s);
      CHECK_MESSAGE(outcome.ok(), "rank ", rank, ": ", outcome.describe());
    }
  }

  SUBCASE("tinyddp-run on two hosts: 2 nodes x 2 workers rendezvous by env://") {
    auto node = [&](int node_rank) {
      return spawn_program(hosts.exec_in(node_rank == 0 ? hosts.a : hosts.b,
                                         {kBin + "/tinyddp-run", "-n", "2", "--nnodes", "2", "--node-rank",
                                          std::to_string(node_rank), "--master-addr", kAddressA, "--master-port",
                                          "29401", kBin + "/test_rendezvous_worker"}),
                           {"TINYDDP_TOKEN=two-hosts-job"});
    };
    Child node1 = node(1);  // the far node first: it waits for node 0's store to appear
    Child node0 = node(0);
    auto o0 = finish_child(node0, 90s);
    auto o1 = finish_child(node1, 90s);
    REQUIRE_MESSAGE(o0.ok(), o0.describe());
    REQUIRE_MESSAGE(o1.ok(), o1.describe());
    CHECK(o0.report.find("[rank 1] rank 1 of 4 joined (restart 0, saw all 4)") != std::string::npos);
    CHECK(o1.report.find("[rank 3] rank 3 of 4 joined (restart 0, saw all 4)") != std::string::npos);
  }
}
