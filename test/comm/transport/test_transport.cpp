// Transports on their own terms: the TCP handshake refuses strangers and wrong tokens, the shared
// memory fifo wraps correctly when it is far smaller than a message, no segment is left in
// /dev/shm once a group is up, a peer that sends and exits at once is read to the end before it
// counts as dead, and a multi-host group listens on one interface, not on every address.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "tinyddp/comm/cpu_binding.h"
#include "tinyddp/comm/store/tcp_store.h"
#include "tinyddp/comm/transport/shm_transport.h"
#include "tinyddp/comm/transport/tcp_transport.h"
#include "tinyddp/core/error.h"
#include "test/comm/helpers/child_process.h"
#include "test/comm/test_collectives_support.h"

using namespace tinyddp;
using namespace tinyddp::comm;
using namespace std::chrono_literals;
using tinyddp::testing::Child;
using tinyddp::testing::ChildGuard;
using tinyddp::testing::ChildOutcome;
using tinyddp::testing::eventually;
using tinyddp::testing::finish_child;
using tinyddp::testing::free_loopback_port;
using tinyddp::testing::make_input;
using tinyddp::testing::reference_reduce;
using tinyddp::testing::run_ranks;
using tinyddp::testing::spawn_child;

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

// Bytes a sender can produce and a receiver can check on its own: byte i is (i * 131 + 7) mod 251.
std::vector<std::byte> pattern(size_t n) {
  std::vector<std::byte> bytes(n);
  for (size_t i = 0; i < n; ++i) bytes[i] = std::byte((i * 131 + 7) % 251);
  return bytes;
}

// Sends all of `bytes` to `to` through non-blocking try_send; false when `timeout` passed first.
bool send_all(Connection& to, const std::vector<std::byte>& bytes, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (size_t sent = 0; sent < bytes.size();) {
    size_t n = to.try_send(bytes.data() + sent, bytes.size() - sent, 1);
    sent += n;
    if (n == 0 && std::chrono::steady_clock::now() > deadline) return false;
    if (n == 0) std::this_thread::sleep_for(100us);
  }
  return true;
}

// Receives `n` bytes from `from`; fewer when `timeout` passed first.
std::vector<std::byte> receive(Connection& from, size_t n, std::chrono::milliseconds timeout) {
  std::vector<std::byte> bytes(n);
  auto deadline = std::chrono::steady_clock::now() + timeout;
  size_t got = 0;
  while (got < n && std::chrono::steady_clock::now() < deadline) {
    size_t k = from.try_recv(bytes.data() + got, n - got);
    got += k;
    if (k == 0) std::this_thread::sleep_for(100us);
  }
  bytes.resize(got);
  return bytes;
}

// The address a listening TCP socket on `port` is bound to, from /proc/net/tcp ("" if none listens).
std::string listening_address(int port) {
  std::ifstream table("/proc/net/tcp");
  std::string line;
  std::getline(table, line);  // the header
  while (std::getline(table, line)) {
    std::istringstream fields(line);
    std::string slot, local, remote, state;
    fields >> slot >> local >> remote >> state;
    if (state != "0A" || local.size() != 13 || std::stoi(local.substr(9), nullptr, 16) != port) continue;
    in_addr addr{};
    addr.s_addr = uint32_t(std::stoul(local.substr(0, 8), nullptr, 16));  // the kernel prints it as a raw word
    char text[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &addr, text, sizeof text);
    return text;
  }
  return "";
}

}  // namespace

TEST_CASE("shm: a peer that sends its last bytes and exits at once is read to the end before it counts as dead") {
  TINYDDP_SKIP_UNDER_TSAN();
  constexpr size_t kBytes = 256 << 10;  // fits the fifo: the sender never waits for room
  for (bool goodbye : {false, true}) {
    CAPTURE(goodbye);
    TcpStoreOptions store_options;
    store_options.timeout = 20s;
    TcpStore store("127.0.0.1", 0, true, store_options);
    const std::string prefix = std::string("exit-after-send/") + (goodbye ? "closed/" : "gone/");
    const int port = store.port();
    Child child = spawn_child([&](std::string& report) {
      TcpStore client("127.0.0.1", port, false, store_options);
      auto sender = std::make_unique<ShmTransport>(client, prefix, 1, std::vector<int>{0, 1}, 20s);
      if (!send_all(*sender->connection(0), pattern(kBytes), 10s)) {
        report = "could not send";
        return 1;
      }
      if (goodbye) sender.reset();  // a clean close: the state word says so
      _exit(0);                     // at once, with the bytes still in the fifo
    });
    ChildGuard guard{child};
    ShmTransport receiver(store, prefix, 0, {0, 1}, 20s);
    auto outcome = finish_child(child, 20s);  // reaped: its pid is gone for sure
    REQUIRE_MESSAGE(outcome.ok(), outcome.describe());
    const std::vector<int> awaiting_it = {1}, awaiting_others = {2};
    // Long stalled, and the peer gone, but everything it sent is still there to read.
    CHECK_NOTHROW(receiver.check_peers(10s, awaiting_it));
    CHECK(receive(*receiver.connection(1), kBytes, 10s) == pattern(kBytes));
    // Now nothing of it is left to read: waiting on it further is a failure, named: as dead when it
    // went without closing, as closed when it closed first (it ended cleanly; the wait is the error).
    CHECK_THROWS_WITH_AS(receiver.check_peers(10s, awaiting_it),
                         doctest::Contains(goodbye ? "rank 1 closed its process group while rank 0 still waits"
                                                   : "rank 1 (pid"),
                         Error);
    if (goodbye) {
      CHECK_NOTHROW(receiver.check_peers(10ms, awaiting_it));  // within the closed peer's grace
      // Done with its part and closed, while this rank waits for another: no failure of its.
      CHECK_NOTHROW(receiver.check_peers(10s, awaiting_others));
    } else {
      // Gone without closing is a death, whoever this rank waits for.
      CHECK_THROWS_WITH_AS(receiver.check_peers(10s, awaiting_others), doctest::Contains("rank 1 (pid"), Error);
    }
  }
}

TEST_CASE("tcp: a peer that sends its last bytes and exits at once is read to the end before it counts as dead") {
  TINYDDP_SKIP_UNDER_TSAN();
  constexpr size_t kBytes = 1 << 20;  // fits the receiver's inbox
  TcpStoreOptions store_options;
  store_options.timeout = 20s;
  TcpStore store("127.0.0.1", 0, true, store_options);
  const int port = store.port();
  const std::vector<std::string> hosts = {"one-host", "one-host"};
  Child child = spawn_child([&](std::string& report) {
    TcpStore client("127.0.0.1", port, false, store_options);
    TcpTransport sender(client, "exit-after-send/", 1, {0}, hosts, {int(::getppid()), int(::getpid())}, 20s);
    if (!send_all(*sender.connection(0), pattern(kBytes), 10s)) {
      report = "could not send";
      return 1;
    }
    _exit(0);  // the kernel still delivers what sits in the socket, then the EOF
  });
  ChildGuard guard{child};
  TcpTransport receiver(store, "exit-after-send/", 0, {1}, hosts, {int(::getpid()), int(child.pid)}, 20s);
  auto outcome = finish_child(child, 20s);
  REQUIRE_MESSAGE(outcome.ok(), outcome.describe());
  // Past the hang-up grace: the EOF has arrived and the pid is gone, but the bytes are unread.
  std::this_thread::sleep_for(1200ms);
  const std::vector<int> awaiting_it = {1}, awaiting_others = {2};
  CHECK_NOTHROW(receiver.check_peers(10s, awaiting_it));
  CHECK(receive(*receiver.connection(1), kBytes, 10s) == pattern(kBytes));
  CHECK_THROWS_WITH_AS(receiver.check_peers(10s, awaiting_it), doctest::Contains("rank(s) 1 died"), Error);
  // Over TCP a clean exit and a death look alike (the pid gone, the connection hung up): it counts only
  // while this rank waits for it.
  CHECK_NOTHROW(receiver.check_peers(10s, awaiting_others));
}

TEST_CASE("tcp: a group spanning hosts listens on its interface, every address only when asked") {
  // Two threads of one process given two host identities: each takes the other for a remote peer.
  const std::vector<std::string> hosts = {"host-a", "host-b"};
  for (bool bind_all : {false, true}) {
    CAPTURE(bind_all);
    HashStore store;
    store.set_timeout(20s);
    TcpTransportOptions options;
    options.bind_all = bind_all;
    const std::string prefix = bind_all ? "bind-all/" : "bind-one/";
    std::unique_ptr<TcpTransport> rank0, rank1;
    std::string published, listening;
    run_ranks(2, [&](int r) {
      if (r == 0) {
        rank0 = std::make_unique<TcpTransport>(store, prefix, 0, std::vector<int>{1}, hosts, std::vector<int>{0, 0},
                                               20s, options);
        return;
      }
      // Rank 0 listens until rank 1 connects: look at its socket first.
      store.wait({prefix + "tcp/0"}, 20s);
      published = store.get(prefix + "tcp/0");
      listening = listening_address(std::stoi(published.substr(published.rfind(':') + 1)));
      rank1 = std::make_unique<TcpTransport>(store, prefix, 1, std::vector<int>{0}, hosts, std::vector<int>{0, 0}, 20s,
                                             options);
    });
    const std::string host = published.substr(0, published.rfind(':'));
    CHECK(host != "0.0.0.0");
    if (bind_all)
      CHECK(listening == "0.0.0.0");
    else
      CHECK_MESSAGE(listening == host, "published ", published, ", listening on '", listening, "'");
    // And the group works through that address.
    REQUIRE(send_all(*rank1->connection(0), pattern(1000), 10s));
    CHECK(receive(*rank0->connection(1), 1000, 10s) == pattern(1000));
  }
}

TEST_CASE("tcp: a stranger knocking on a rank's port is refused and the group still forms") {
  auto store = std::make_shared<HashStore>();
  store->set_timeout(20s);
  std::shared_ptr<ProcessGroup> rank0, rank1;
  std::thread first([&] { rank0 = create_process_group("host", store, 0, 2, tcp_options("strangers")); });
  // Play rank 1's first step (publishing its host) so rank 0 starts listening before rank 1 exists.
  store->set("tinyddp/pg/strangers/1/host/1",
             std::to_string(::getpid()) + " " + own_cpu_list() + " " + host_identity());
  const std::string key = "tinyddp/pg/strangers/1/tcp/0";
  store->wait({key}, 20s);
  std::string where = store->get(key);
  CHECK(refused_after_sending(where, std::string(32, 'x')));                 // not a handshake at all
  CHECK(refused_after_sending(where, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"));  // a web client
  std::thread second([&] { rank1 = create_process_group("host", store, 1, 2, tcp_options("strangers")); });
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
      create_process_group("host", store, r, 2, o);
    } catch (const std::exception& e) {
      errors[size_t(r)] = e.what();
    }
  });
  CHECK_MESSAGE(errors[1].find("refused or did not answer rank 1's handshake") != std::string::npos, errors[1]);
  CHECK_MESSAGE(errors[1].find("TINYDDP_TOKEN") != std::string::npos, errors[1]);
  CHECK_MESSAGE(errors[0].find("waiting for rank(s) 1 to connect") != std::string::npos, errors[0]);
}

TEST_CASE("shm: a fifo far smaller than the message wraps around correctly") {
  auto store = std::make_shared<HashStore>();
  ProcessGroupOptions o;
  o.transport = "shm";
  o.shm_fifo_bytes = 4096;  // one page: a 400 KB all-reduce wraps it a hundred times
  o.group_name = "tiny-fifo";
  o.timeout = 20s;
  std::vector<std::shared_ptr<ProcessGroup>> groups(3);
  run_ranks(3, [&](int r) { groups[size_t(r)] = create_process_group("host", store, r, 3, o); });
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

TEST_CASE("shm: a large collective's bytes start at the same place in a page whatever came before") {
  // Why this matters: see Connection::align_send. Here rank 1 first sends a few bytes, which moves
  // the stream off any boundary, then both ends align, and the next bytes must start exactly
  // `phase` past a page boundary of the fifo and arrive intact.
  auto store = std::make_shared<HashStore>();
  std::vector<std::unique_ptr<ShmTransport>> transports(2);
  run_ranks(2, [&](int r) {
    transports[size_t(r)] = std::make_unique<ShmTransport>(*store, "align/", r, std::vector<int>{0, 1}, 20s);
  });
  Connection& to0 = *transports[1]->connection(0);
  Connection& from1 = *transports[0]->connection(1);
  std::vector<std::byte> data(100000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = std::byte(i * 7 + 3);
  for (size_t history : {size_t(4), size_t(12), size_t(3000)}) {
    CAPTURE(history);
    std::vector<std::byte> first(history, std::byte(0xee)), got(history);
    REQUIRE(to0.try_send(first.data(), first.size(), 1) == first.size());
    REQUIRE(from1.try_recv(got.data(), got.size()) == got.size());
    for (size_t phase : {size_t(0), size_t(2048), size_t(4000)}) {
      CAPTURE(phase);
      to0.align_send(phase);
      from1.align_recv(phase);
      CHECK(from1.try_peek(1).empty());  // nothing sent yet: the skipped bytes are not data
      size_t sent = 0, received = 0;
      std::vector<std::byte> out(data.size());
      bool first_piece = true;
      while (received < data.size()) {
        sent += to0.try_send(data.data() + sent, data.size() - sent, 4);
        auto piece = from1.try_peek(data.size() - received);
        if (piece.empty()) continue;
        if (first_piece) CHECK(reinterpret_cast<uintptr_t>(piece.data()) % 4096 == phase);
        first_piece = false;
        std::memcpy(out.data() + received, piece.data(), piece.size());
        received += piece.size();
        from1.release(piece.size());
      }
      CHECK(sent == data.size());
      CHECK(out == data);
    }
  }
}

TEST_CASE("shm: ranks whose fifos differ in size still read each other's bytes in the right places") {
  auto store = std::make_shared<HashStore>();
  std::vector<std::shared_ptr<ProcessGroup>> groups(2);
  run_ranks(2, [&](int r) {
    ProcessGroupOptions o;
    o.transport = "shm";
    o.group_name = "mixed-fifos";
    o.timeout = 20s;
    o.shm_fifo_bytes = r == 0 ? (64 << 10) : (1 << 20);  // TINYDDP_SHM_FIFO_BYTES set differently per rank
    groups[size_t(r)] = create_process_group("host", store, r, 2, o);
  });
  std::vector<std::string> failures(2);
  run_ranks(2, [&](int r) {
    for (int64_t count : {int64_t(1000), int64_t(300001)}) {  // 1.2 MB: wraps both fifos
      Tensor t = make_input<float>(ReduceOp::sum, r, count);
      groups[size_t(r)]->all_reduce(t)->wait();
      if (t.to_vector<float>() != reference_reduce<float>(ReduceOp::sum, 2, count))
        failures[size_t(r)] = "rank " + std::to_string(r) + " x" + std::to_string(count) + " differs";
    }
  });
  for (auto& f : failures) CHECK_MESSAGE(f.empty(), f);
}

namespace {
// The segments in /dev/shm that process `pid` named (the shm transport ends every name in "-<pid>").
std::vector<std::string> segments_of(pid_t pid) {
  const std::string mine = "-" + std::to_string(pid);
  std::vector<std::string> found;
  if (DIR* dir = ::opendir("/dev/shm")) {
    while (dirent* entry = ::readdir(dir)) {
      std::string name = entry->d_name;
      if (name.rfind("tinyddp-", 0) == 0 && name.size() > mine.size() &&
          name.compare(name.size() - mine.size(), mine.size(), mine) == 0)
        found.push_back(name);
    }
    ::closedir(dir);
  }
  return found;
}
}  // namespace

TEST_CASE("shm: no segment is left in /dev/shm once the group is up") {
  auto groups = tinyddp::testing::make_groups(2, [] {
    ProcessGroupOptions o;
    o.transport = "shm";
    o.group_name = "unlinked";
    return o;
  }());
  const std::vector<std::string> left = segments_of(::getpid());
  CHECK_MESSAGE(left.empty(), "left behind: ", left.size(), " segment(s), e.g. ", left.empty() ? "" : left[0]);
}

namespace {

// Waits until `child` has named a segment containing `fragment` in /dev/shm, stops it with SIGTERM
// (which unwinds nothing), and checks that it left no segment of its there.
void stop_once_it_names(Child& child, const std::string& fragment) {
  REQUIRE(eventually(
      [&] {
        for (const std::string& name : segments_of(child.pid))
          if (name.find(fragment) != std::string::npos) return true;
        return false;
      },
      std::chrono::seconds(30)));
  const pid_t pid = child.pid;  // finish_child forgets it
  REQUIRE(::kill(pid, SIGTERM) == 0);
  ChildOutcome out = finish_child(child, std::chrono::seconds(30));
  CHECK_MESSAGE(out.signal == SIGTERM, out.describe());
  const std::vector<std::string> left = segments_of(pid);
  for (const std::string& name : left) ::shm_unlink(("/" + name).c_str());  // not left to the next run
  CHECK_MESSAGE(left.empty(), "left behind: ", left.size(), " segment(s), e.g. ", left.empty() ? "" : left[0]);
}

}  // namespace

TEST_CASE("shm: a rank stopped by SIGTERM while its peer has not mapped the control table leaves nothing behind") {
  // The lowest rank of a host names the control table in /dev/shm and waits, as long as the group's
  // timeout, for every local rank to map it. A peer that died first (before it mapped the table)
  // leaves it waiting, and the launcher then stops it with SIGTERM, which unwinds nothing.
  TINYDDP_SKIP_UNDER_TSAN();
  const int port = free_loopback_port();
  TcpStoreOptions store_options;
  store_options.timeout = 30s;
  auto store = std::make_shared<TcpStore>("127.0.0.1", port, true, store_options);
  Child rank0 = spawn_child([&](std::string&) {
    for (int s : {SIGINT, SIGTERM, SIGHUP}) signal(s, SIG_DFL);  // as a program starts (the runner catches them)
    auto client = std::make_shared<TcpStore>("127.0.0.1", port, false, store_options);
    ProcessGroupOptions o;
    o.transport = "shm";
    o.group_name = "table-wait";
    o.timeout = 60s;
    create_process_group("host", client, 0, 2, o);
    return 5;  // not reached: rank 1 never maps the table
  });
  ChildGuard guard{rank0};
  // Rank 1 says it is on this host, and then never comes (as a rank killed right after would).
  store->set("tinyddp/pg/table-wait/1/host/1",
             std::to_string(::getpid()) + " " + own_cpu_list() + " " + host_identity());
  stop_once_it_names(rank0, "-table-0-" + std::to_string(rank0.pid));
}

TEST_CASE("shm: a rank stopped by SIGTERM after it sent into a fifo its peer never opened leaves nothing behind") {
  // A fifo's name stays in /dev/shm until its receiver opens it (then the receiver unlinks it). A
  // sender stopped by SIGTERM before that unwinds nothing, so its stop must take the name.
  TINYDDP_SKIP_UNDER_TSAN();
  TcpStoreOptions store_options;
  store_options.timeout = 20s;
  TcpStore store("127.0.0.1", 0, true, store_options);
  const int port = store.port();
  Child sender = spawn_child([&](std::string& report) {
    for (int s : {SIGINT, SIGTERM, SIGHUP}) signal(s, SIG_DFL);  // as a program starts (the runner catches them)
    TcpStore client("127.0.0.1", port, false, store_options);
    ShmTransport transport(client, "unopened-fifo/", 0, {0, 1}, 20s);
    if (!send_all(*transport.connection(1), pattern(4096), 10s)) {
      report = "could not send";
      return 1;
    }
    std::this_thread::sleep_for(60s);  // stopped before this ends
    return 5;
  });
  ChildGuard guard{sender};
  ShmTransport receiver(store, "unopened-fifo/", 1, {0, 1}, 20s);  // maps the table; never reads
  stop_once_it_names(sender, "-0to1-" + std::to_string(sender.pid));
}

namespace {

// A store through which rank `elsewhere` reports a host identity of its own, as a rank on another
// host would (the host backend publishes "<pid> <cpus> <host identity>" under .../host/<rank>).
class ElsewhereStore : public HashStore {
 public:
  explicit ElsewhereStore(int elsewhere) : suffix_("host/" + std::to_string(elsewhere)) {}
  void set(const std::string& key, const std::string& value) override {
    const bool moved = key.size() >= suffix_.size() &&
                       key.compare(key.size() - suffix_.size(), suffix_.size(), suffix_) == 0;
    HashStore::set(key, moved ? value + "-on-another-host" : value);
  }

 private:
  std::string suffix_;
};

}  // namespace

TEST_CASE("shm: a group needs every rank on one host") {
  // Host identities are what decides; two threads of one process always share one.
  CHECK(host_identity() == host_identity());
  CHECK(host_identity().find('/') != std::string::npos);
  // Rank 1 says it runs elsewhere: each rank refuses transport 'shm', naming the other.
  auto store = std::make_shared<ElsewhereStore>(1);
  store->set_timeout(std::chrono::seconds(30));
  std::vector<std::string> errors(2);
  tinyddp::testing::run_ranks(2, [&](int r) {
    ProcessGroupOptions o;
    o.transport = "shm";
    o.group_name = "two-hosts";
    try {
      create_process_group("host", store, r, 2, o);
    } catch (const std::exception& e) {
      errors[size_t(r)] = e.what();
    }
  });
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    const std::string other = std::to_string(1 - r);
    CHECK_MESSAGE(errors[size_t(r)].find("transport 'shm' needs every rank on one host, but rank(s) " + other +
                                         " run on another host than rank " + std::to_string(r)) != std::string::npos,
                  errors[size_t(r)]);
  }
}
