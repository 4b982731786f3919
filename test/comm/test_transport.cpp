// Transports on their own terms: the TCP handshake refuses strangers and wrong tokens, the shared
// memory ring wraps correctly when it is far smaller than a message, and no segment is left in
// /dev/shm once a group is up.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm/shm_transport.h"
#include "core/error.h"
#include "test_collectives_support.h"

using namespace tinyddp;
using namespace tinyddp::comm;
using namespace std::chrono_literals;
using tinyddp::testing::make_input;
using tinyddp::testing::reference_reduce;
using tinyddp::testing::run_ranks;

namespace {

ProcessGroupOptions tcp_options(const std::string& name) {
  ProcessGroupOptions o;
  o.transport = "tcp";
  o.group_name = name;
  o.timeout = 20s;
  return o;
}

// Connects to "host:port" and sends `bytes`; true when the other side then closes the connection.
bool refused_after_sending(const std::string& where, const std::string& bytes) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(std::stoi(where.substr(where.rfind(':') + 1))));
  ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  bool closed = false;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    timeval tv{10, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char c;
    closed = ::recv(fd, &c, 1, 0) == 0;
  }
  ::close(fd);
  return closed;
}

}  // namespace

TEST_CASE("tcp: a stranger knocking on a rank's port is refused and the group still forms") {
  auto store = std::make_shared<HashStore>();
  store->set_timeout(20s);
  std::shared_ptr<ProcessGroup> rank0, rank1;
  std::thread first([&] { rank0 = create_process_group("ring", store, 0, 2, tcp_options("strangers")); });
  // Play rank 1's first step (publishing its host) so rank 0 starts listening before rank 1 exists.
  store->set("tinyddp/pg/strangers/1/host/1", std::to_string(::getpid()) + " " + host_identity());
  const std::string key = "tinyddp/pg/strangers/1/tcp/0";
  store->wait({key}, 20s);
  std::string where = store->get(key);
  CHECK(refused_after_sending(where, std::string(32, 'x')));                // not a handshake at all
  CHECK(refused_after_sending(where, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"));  // a web client
  std::thread second([&] { rank1 = create_process_group("ring", store, 1, 2, tcp_options("strangers")); });
  first.join();
  second.join();
  REQUIRE(rank0);
  REQUIRE(rank1);
  run_ranks(2, [&](int r) {
    Tensor t = Tensor::from_vector(std::vector<int32_t>{r + 1});
    (r == 0 ? rank0 : rank1)->all_reduce(t)->wait();
    CHECK(t.item<int32_t>() == 3);
  });
}

TEST_CASE("tcp: ranks with different job tokens refuse each other") {
  auto store = std::make_shared<HashStore>();
  std::vector<std::string> errors(2);
  run_ranks(2, [&](int r) {
    ProcessGroupOptions o = tcp_options("tokens");
    o.timeout = 1500ms;
    o.token = r == 0 ? "alpha" : "beta";
    try {
      create_process_group("ring", store, r, 2, o);
    } catch (const std::exception& e) {
      errors[size_t(r)] = e.what();
    }
  });
  CHECK_MESSAGE(errors[1].find("refused or did not answer rank 1's handshake") != std::string::npos, errors[1]);
  CHECK_MESSAGE(errors[1].find("TINYDDP_TOKEN") != std::string::npos, errors[1]);
  CHECK_MESSAGE(errors[0].find("waiting for rank(s) 1 to connect") != std::string::npos, errors[0]);
}

TEST_CASE("shm: a ring far smaller than the message wraps around correctly") {
  auto store = std::make_shared<HashStore>();
  ProcessGroupOptions o;
  o.transport = "shm";
  o.shm_ring_bytes = 4096;  // one page: a 400 KB all-reduce wraps it a hundred times
  o.group_name = "tiny-ring";
  o.timeout = 20s;
  std::vector<std::shared_ptr<ProcessGroup>> groups(3);
  run_ranks(3, [&](int r) { groups[size_t(r)] = create_process_group("ring", store, r, 3, o); });
  std::vector<std::string> failures(3);
  run_ranks(3, [&](int r) {
    for (int64_t count : {int64_t(1000), int64_t(100003)}) {
      Tensor t = make_input<double>(ReduceOp::sum, r, count);
      groups[size_t(r)]->all_reduce(t)->wait();
      if (t.to_vector<double>() != reference_reduce<double>(ReduceOp::sum, 3, count))
        failures[size_t(r)] = "rank " + std::to_string(r) + " x" + std::to_string(count) + " differs";
    }
  });
  for (auto& f : failures) CHECK_MESSAGE(f.empty(), f);
}

TEST_CASE("shm: no segment is left in /dev/shm once the group is up") {
  auto groups = tinyddp::testing::make_groups(2, [] {
    ProcessGroupOptions o;
    o.transport = "shm";
    o.group_name = "unlinked";
    return o;
  }());
  std::string mine = "-" + std::to_string(::getpid());
  std::vector<std::string> left;
  if (DIR* dir = ::opendir("/dev/shm")) {
    while (dirent* entry = ::readdir(dir)) {
      std::string name = entry->d_name;
      if (name.rfind("tinyddp-", 0) == 0 && name.size() > mine.size() && name.compare(name.size() - mine.size(), mine.size(), mine) == 0)
        left.push_back(name);
    }
    ::closedir(dir);
  }
  CHECK_MESSAGE(left.empty(), "left behind: ", left.size(), " segment(s), e.g. ", left.empty() ? "" : left[0]);
}

TEST_CASE("shm: a group needs every rank on one host") {
  // Host identities are what decides; two threads of one process always share one.
  CHECK(host_identity() == host_identity());
  CHECK(host_identity().find('/') != std::string::npos);
}
