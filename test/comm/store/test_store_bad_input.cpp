// Bad input never takes the store server down: each case below closes that one connection with a
// logged reason, and a good client connected before it, and one connecting after it, are served.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <mutex>
#include <random>
#include <thread>

#include "tinyddp/comm/store/store_protocol.h"
#include "tinyddp/comm/store/store_server.h"
#include "tinyddp/comm/store/tcp_store.h"
#include "tinyddp/core/error.h"
#include "test/comm/helpers/child_process.h"

using namespace tinyddp;
using namespace tinyddp::comm;
using namespace std::chrono_literals;
using tinyddp::testing::eventually;

namespace {

// A server whose log lines are kept, so a test can check the reason a connection was closed for.
struct LoggedServer {
  std::mutex mutex;
  std::vector<std::string> lines;
  std::unique_ptr<StoreServer> server;

  explicit LoggedServer(std::string token = "", std::chrono::milliseconds idle = 300ms) {
    StoreServerOptions options;
    options.host = "127.0.0.1";
    options.token = std::move(token);
    options.idle_limit = idle;
    options.limits.max_value_bytes = 1u << 20;
    options.log = [this](LogLevel, const std::string& line) {
      std::lock_guard<std::mutex> lock(mutex);
      lines.push_back(line);
    };
    server = std::make_unique<StoreServer>(options);
  }
  int port() { return server->port(); }
  bool logged(const std::string& needle) {
    return eventually([&] {
      std::lock_guard<std::mutex> lock(mutex);
      for (const auto& l : lines)
        if (l.find(needle) != std::string::npos) return true;
      return false;
    });
  }
  std::string log_text() {
    std::lock_guard<std::mutex> lock(mutex);
    std::string all;
    for (const auto& l : lines) all += l + "\n";
    return all;
  }
};

// A plain socket that sends whatever bytes a test wants, well-formed or not.
struct RawClient {
  int fd = -1;
  explicit RawClient(int port) {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(uint16_t(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  }
  ~RawClient() {
    if (fd >= 0) close(fd);
  }
  void send_bytes(const std::string& bytes) {
    // MSG_NOSIGNAL: the server may already have closed us; that must not kill the test with SIGPIPE.
    size_t at = 0;
    while (at < bytes.size()) {
      ssize_t n = ::send(fd, bytes.data() + at, bytes.size() - at, MSG_NOSIGNAL);
      if (n <= 0) return;
      at += size_t(n);
    }
  }
  void hello(const std::string& token = "", uint16_t version = protocol::kVersion) {
    send_bytes(protocol::encode_hello({protocol::kMagic, version, token}));
  }
  // Reads whatever arrives until the server closes the connection (true) or the timeout passes (false).
  bool closed_by_server(std::chrono::milliseconds timeout = 5s, std::string* received = nullptr) {
    auto deadline = testing::Clock::now() + timeout;
    char buffer[4096];
    while (testing::Clock::now() < deadline) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 20) <= 0) continue;
      ssize_t n = recv(fd, buffer, sizeof buffer, 0);
      if (n <= 0) return true;
      if (received) received->append(buffer, size_t(n));
    }
    return false;
  }
  void finish_sending() { shutdown(fd, SHUT_WR); }
};

std::string u32(uint32_t v) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i) s[i] = char(v >> (8 * i));
  return s;
}

TcpStoreOptions client_options() {
  TcpStoreOptions options;
  options.timeout = 5s;
  options.token = "";
  return options;
}

// A good client, connected before the bad one, and a fresh one after: both must be served.
void check_still_serving(LoggedServer& server, TcpStore& before, const std::string& tag) {
  before.set("before/" + tag, "ok");
  TcpStore after("127.0.0.1", server.port(), false, client_options());
  CHECK(after.get("before/" + tag) == "ok");
  CHECK(after.add("served", 1) > 0);
}

// Lowers this process's address-space limit (RLIMIT_AS) to what is mapped now plus `headroom`, and
// puts the old limit back at scope exit. The limit binds every thread, so the test that holds it
// starts no other work meanwhile.
class AddressSpaceCap {
 public:
  explicit AddressSpaceCap(uint64_t headroom) {
    REQUIRE(::getrlimit(RLIMIT_AS, &old_) == 0);
    uint64_t mapped_pages = 0;
    std::ifstream("/proc/self/statm") >> mapped_pages;
    REQUIRE(mapped_pages > 0);
    rlimit capped = old_;
    capped.rlim_cur = rlim_t(mapped_pages * uint64_t(::sysconf(_SC_PAGESIZE)) + headroom);
    if (old_.rlim_max != RLIM_INFINITY && capped.rlim_cur > old_.rlim_max) capped.rlim_cur = old_.rlim_max;
    REQUIRE(::setrlimit(RLIMIT_AS, &capped) == 0);
  }
  ~AddressSpaceCap() { ::setrlimit(RLIMIT_AS, &old_); }
  AddressSpaceCap(const AddressSpaceCap&) = delete;
  AddressSpaceCap& operator=(const AddressSpaceCap&) = delete;

  // True when mapping `bytes` now fails (the cap holds). Reserved, never touched: nothing is used.
  static bool refuses(uint64_t bytes) {
    void* p = ::mmap(nullptr, size_t(bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1,
                     0);
    if (p == MAP_FAILED) return true;
    ::munmap(p, size_t(bytes));
    return false;
  }

 private:
  rlimit old_{};
};

}  // namespace

TEST_CASE("each kind of bad input closes only its own connection, with the reason logged") {
  LoggedServer server;
  TcpStore before("127.0.0.1", server.port(), false, client_options());

  SUBCASE("random bytes instead of a hello") {
    RawClient bad(server.port());
    bad.send_bytes("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    CHECK(bad.closed_by_server());
    CHECK(server.logged("wrong magic number"));
    check_still_serving(server, before, "random");
  }
  SUBCASE("a client that connects and says nothing") {
    RawClient silent(server.port());
    CHECK(silent.closed_by_server());
    CHECK(server.logged("sent no complete hello within the idle limit of 300 ms"));
    check_still_serving(server, before, "silent");
  }
  SUBCASE("a wrong protocol version is answered with the reason, then closed") {
    RawClient old(server.port());
    old.hello("", 99);
    std::string reply;
    CHECK(old.closed_by_server(5s, &reply));
    REQUIRE(reply.size() >= protocol::kHelloReplyHeadBytes);
    protocol::HelloReply decoded;
    protocol::decode_hello_reply_head(reply.substr(0, protocol::kHelloReplyHeadBytes), decoded);
    CHECK(decoded.status == protocol::HelloStatus::bad_version);
    CHECK(server.logged("protocol version 99 is not this server's version 1"));
    check_still_serving(server, before, "version");
  }
  SUBCASE("a token length over the bound") {
    RawClient bad(server.port());
    bad.send_bytes(u32(protocol::kMagic) + std::string("\x01\x00\x00\x00", 4) + u32(1u << 30));
    CHECK(bad.closed_by_server());
    CHECK(server.logged("token of 1073741824 bytes is over the limit"));
    check_still_serving(server, before, "token-length");
  }
  SUBCASE("a frame claiming more than the bound, refused before any allocation") {
    RawClient bad(server.port());
    bad.hello();
    bad.send_bytes(u32(0xfffffff0u));
    CHECK(bad.closed_by_server());
    CHECK(server.logged("claimed length of 4294967280 bytes is outside"));
    check_still_serving(server, before, "huge");
  }
  SUBCASE("an empty frame") {
    RawClient bad(server.port());
    bad.hello();
    bad.send_bytes(u32(0));
    CHECK(bad.closed_by_server());
    CHECK(server.logged("claimed length of 0 bytes"));
    check_still_serving(server, before, "empty");
  }
  SUBCASE("an unknown command") {
    RawClient bad(server.port());
    bad.hello();
    bad.send_bytes(u32(1) + "\x7f");
    CHECK(bad.closed_by_server());
    CHECK(server.logged("unknown command 0x7f"));
    check_still_serving(server, before, "command");
  }
  SUBCASE("a truncated frame: the client hangs up halfway") {
    RawClient bad(server.port());
    bad.hello();
    bad.send_bytes(u32(100) + std::string(10, 'x'));
    bad.finish_sending();
    CHECK(bad.closed_by_server());
    CHECK(server.logged("truncated frame body: the client hung up after 10 of 100 bytes"));
    check_still_serving(server, before, "truncated");
  }
  SUBCASE("a truncated frame: the client stalls halfway") {
    RawClient bad(server.port());
    bad.hello();
    bad.send_bytes(u32(100) + std::string(10, 'x'));
    CHECK(bad.closed_by_server());
    CHECK(server.logged("sent a partial frame and not the rest within the idle limit"));
    check_still_serving(server, before, "stalled");
  }
  SUBCASE("a string length that runs past the end of its frame") {
    RawClient bad(server.port());
    bad.hello();
    std::string body = std::string(1, char(protocol::Command::set)) + u32(1000) + "key";
    bad.send_bytes(u32(uint32_t(body.size())) + body);
    CHECK(bad.closed_by_server());
    // 1000 is within the key bound, but not within the frame.
    CHECK(server.logged("key needs 1000 bytes but only 3 remain"));
    check_still_serving(server, before, "overrun");
  }
  SUBCASE("a list count no frame could hold") {
    RawClient bad(server.port());
    bad.hello();
    std::string body = std::string(1, char(protocol::Command::check)) + u32(60000) + u32(1) + "k";
    bad.send_bytes(u32(uint32_t(body.size())) + body);
    CHECK(bad.closed_by_server());
    CHECK(server.logged("claims 60000 keys but only 5 bytes follow"));
    check_still_serving(server, before, "count");
  }
  SUBCASE("a key over max_key_bytes, with all its bytes present") {
    RawClient bad(server.port());
    bad.hello();
    std::string body = std::string(1, char(protocol::Command::set)) + u32(5000) + std::string(5000, 'k') + u32(1) + "v";
    bad.send_bytes(u32(uint32_t(body.size())) + body);
    CHECK(bad.closed_by_server());
    CHECK(server.logged("key of 5000 bytes is over the limit of 4096"));
    CHECK(before.num_keys() == 0);  // nothing of it was stored
    check_still_serving(server, before, "long-key");
  }
  SUBCASE("a value over max_value_bytes, within the frame bound") {
    RawClient bad(server.port());
    bad.hello();
    const uint32_t too_big = (1u << 20) + 1;  // this server's max_value_bytes is 1 MiB
    std::string body = std::string(1, char(protocol::Command::set)) + u32(1) + "k" + u32(too_big) +
                       std::string(too_big, 'v');
    bad.send_bytes(u32(uint32_t(body.size())) + body);
    CHECK(bad.closed_by_server());
    CHECK(server.logged("value of 1048577 bytes is over the limit of 1048576"));
    CHECK(before.num_keys() == 0);
    check_still_serving(server, before, "big-value");
  }
  SUBCASE("more keys in one request than max_keys_per_request") {
    RawClient bad(server.port());
    bad.hello();
    std::string body = std::string(1, char(protocol::Command::check)) + u32(70000);
    for (int i = 0; i < 70000; ++i) body += u32(1) + "k";
    bad.send_bytes(u32(uint32_t(body.size())) + body);
    CHECK(bad.closed_by_server());
    CHECK(server.logged("a list of 70000 keys is over the limit of 65536"));
    check_still_serving(server, before, "many-keys");
  }
  SUBCASE("bytes left over after the last field") {
    RawClient bad(server.port());
    bad.hello();
    std::string body = std::string(1, char(protocol::Command::num_keys)) + "extra";
    bad.send_bytes(u32(uint32_t(body.size())) + body);
    CHECK(bad.closed_by_server());
    CHECK(server.logged("5 unexpected bytes after the last field"));
    check_still_serving(server, before, "extra");
  }
  SUBCASE("a second request while a wait is parked") {
    RawClient bad(server.port());
    bad.hello();
    protocol::Request wait;
    wait.command = protocol::Command::wait;
    wait.keys = {"never"};
    wait.timeout_ms = 60000;
    bad.send_bytes(protocol::encode_request(wait));
    REQUIRE(eventually([&] { return server.server->stats().waiting == 1; }));
    bad.send_bytes(protocol::encode_request(wait));
    CHECK(bad.closed_by_server());
    CHECK(server.logged("sent a new request while its wait was still waiting"));
    CHECK(server.server->stats().waiting == 0);
    check_still_serving(server, before, "pipelined");
  }
  SUBCASE("a client that hangs up while its wait is parked is forgotten") {
    {
      RawClient leaving(server.port());
      leaving.hello();
      protocol::Request get;
      get.command = protocol::Command::get;
      get.keys = {"later"};
      get.timeout_ms = 60000;
      leaving.send_bytes(protocol::encode_request(get));
      REQUIRE(eventually([&] { return server.server->stats().waiting == 1; }));
    }
    CHECK(eventually([&] { return server.server->stats().waiting == 0; }));
    before.set("later", "nobody is waiting any more");
    check_still_serving(server, before, "hung-up");
  }
  before.set("end", "1");
  CHECK(before.get("end") == "1");
}

TEST_CASE("a wrong token is refused and logged; the right one is served") {
  LoggedServer server("letmein");
  TcpStoreOptions good = client_options();
  good.token = "letmein";
  TcpStore before("127.0.0.1", server.port(), false, good);
  RawClient wrong(server.port());
  wrong.hello("letmeout");
  std::string reply;
  CHECK(wrong.closed_by_server(5s, &reply));
  REQUIRE(reply.size() >= protocol::kHelloReplyHeadBytes);
  protocol::HelloReply decoded;
  protocol::decode_hello_reply_head(reply.substr(0, protocol::kHelloReplyHeadBytes), decoded);
  CHECK(decoded.status == protocol::HelloStatus::bad_token);
  CHECK(server.logged("the token presented is wrong"));
  before.set("k", "v");
  TcpStore after("127.0.0.1", server.port(), false, good);
  CHECK(after.get("k") == "v");
}

TEST_CASE("a storm of random frames after a valid hello never stops the server") {
  LoggedServer server("", 100ms);
  TcpStore before("127.0.0.1", server.port(), false, client_options());
  std::mt19937 random(12345);
  for (int i = 0; i < 200; ++i) {
    RawClient bad(server.port());
    if (i % 4 != 0) bad.hello();  // most get past the hello, to reach the frame parser
    size_t n = random() % 64;
    std::string junk(n, '\0');
    for (auto& c : junk) c = char(random());
    if (i % 3 == 0 && n > 4) junk.replace(0, 4, u32(uint32_t(n - 4)));  // a plausible length, junk body
    bad.send_bytes(junk);
    bad.finish_sending();
    bad.closed_by_server(2s);
  }
  CHECK(eventually([&] { return server.server->stats().open == 1; }));
  before.set("survived", "yes");
  TcpStore after("127.0.0.1", server.port(), false, client_options());
  CHECK(after.get("survived") == "yes");
}

TEST_CASE("a client is not made to allocate by a reply's length prefix: a peer claiming a 4 GiB reply is refused") {
  // A fake store on a socket: a well-formed hello reply advertising a huge value limit, then a
  // response frame that claims 0xfffffff0 bytes, sends 100 and hangs up.
  int fake_port = 0;
  int listener = tinyddp::testing::loopback_listener(&fake_port, 4);
  REQUIRE(listener >= 0);
  std::thread fake([listener] {
    pollfd p{listener, POLLIN, 0};
    if (::poll(&p, 1, 10000) != 1) return;
    int fd = ::accept(listener, nullptr, nullptr);
    auto read_n = [fd](size_t n) {
      std::string got;
      char buffer[4096];
      while (got.size() < n) {
        pollfd q{fd, POLLIN, 0};
        if (::poll(&q, 1, 10000) != 1) break;
        ssize_t k = ::recv(fd, buffer, std::min(sizeof buffer, n - got.size()), 0);
        if (k <= 0) break;
        got.append(buffer, size_t(k));
      }
      return got;
    };
    std::string head = read_n(protocol::kHelloHeadBytes);
    uint16_t version = 0;
    uint32_t token_bytes = protocol::decode_hello_head(head, version);
    read_n(token_bytes);
    std::string reply = protocol::encode_hello_reply(
        {protocol::kVersion, protocol::HelloStatus::ok, 4096, 1ull << 40, ""});
    std::string frame = u32(0xfffffff0u) + std::string(100, 'x');
    ::send(fd, reply.data(), reply.size(), MSG_NOSIGNAL);
    std::string prefix = read_n(protocol::kFrameLengthBytes);  // the client's request
    read_n(protocol::decode_frame_length(prefix, protocol::Limits{}));
    ::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL);
    ::close(fd);
  });
  {
    // Believing the prefix would mean allocating 4 GiB; reading as bytes arrive takes a few hundred
    // KiB. With the address space capped 1 GiB above what is mapped now, the 4 GiB cannot be had
    // (it would come back as std::bad_alloc, not the Error checked here). A cap, not the peak RSS: an
    // allocation that is never written to does not raise the RSS.
    AddressSpaceCap cap(1ull << 30);
    CHECK(cap.refuses(4ull << 30));
    TcpStore client("127.0.0.1", fake_port, false, client_options());
    CHECK_THROWS_AS(client.get("k"), Error);
  }
  fake.join();
  ::close(listener);
}

namespace {

// A server of another protocol on a loopback port: on each connection it sends `greeting` (nothing
// when empty) and then keeps the connection open without reading, as a server waiting for its own
// protocol's first words does.
struct ForeignServer {
  int listener = -1;
  int port = 0;
  std::string greeting;
  std::atomic<bool> stop{false};
  std::thread thread;
  std::vector<int> accepted;

  explicit ForeignServer(std::string words) : greeting(std::move(words)) {
    listener = tinyddp::testing::loopback_listener(&port);
    REQUIRE(listener >= 0);
    thread = std::thread([this] {
      while (!stop) {
        pollfd p{listener, POLLIN, 0};
        if (::poll(&p, 1, 50) != 1) continue;
        int fd = ::accept(listener, nullptr, nullptr);
        if (fd < 0) continue;
        if (!greeting.empty()) ::send(fd, greeting.data(), greeting.size(), MSG_NOSIGNAL);
        accepted.push_back(fd);
      }
    });
  }
  ~ForeignServer() {
    stop = true;
    thread.join();
    for (int fd : accepted) ::close(fd);
    ::close(listener);
  }
};

std::string connect_error(int port, std::chrono::milliseconds hello_silence, std::chrono::milliseconds* took) {
  TcpStoreOptions options;
  options.timeout = 60s;
  options.token = "";
  options.hello_silence = hello_silence;
  const auto start = std::chrono::steady_clock::now();
  std::string message = "(connected)";
  try {
    TcpStore client("127.0.0.1", port, false, options);
  } catch (const Error& e) {
    message = e.message();
  }
  *took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
  return message;
}

}  // namespace

TEST_CASE("a port held by another kind of server fails at once, saying it is not a tinyddp store and who holds it") {
  const std::string holder = "(the port is held by pid " + std::to_string(::getpid()) + " (";
  std::chrono::milliseconds took{};
  {
    // A server that speaks first (SSH, SMTP, FTP do): its words are quoted, and the client does not
    // retry for the 60 s it was given.
    ForeignServer ssh("SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n");
    const std::string message = connect_error(ssh.port, 10s, &took);
    CHECK_MESSAGE(
        message.rfind("the server at 127.0.0.1:" + std::to_string(ssh.port) +
                          " answered \"SSH-2.0-OpenSSH_9.2p1 Debian-2\\x0d\\x0a\": it is not a tinyddp store " + holder,
                      0) == 0,
        message);
    CHECK(message.find("; hint: MASTER_ADDR/MASTER_PORT (or tcp://host:port) name another program's port: choose a "
                       "free port, or stop that program") != std::string::npos);
    CHECK(took < 5s);
  }
  {
    // A server that answers with something else than a store's reply (an HTTP server's 400).
    ForeignServer http("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
    const std::string message = connect_error(http.port, 10s, &took);
    CHECK_MESSAGE(message.find(
                      "answered \"HTTP/1.1 400 Bad Request\\x0d\\x0aContent-Length: 0\\x0d\\x0a\\x0d\\x0a\": it "
                      "is not a tinyddp store") != std::string::npos,
                  message);
    CHECK(took < 5s);
  }
  {
    // A server that waits for its own protocol's first words: silent for hello_silence, then named.
    ForeignServer silent("");
    const std::string message = connect_error(silent.port, 1s, &took);
    CHECK_MESSAGE(
        message.rfind("the server at 127.0.0.1:" + std::to_string(silent.port) +
                          " accepted the connection but sent no reply to the hello in 1.0 s (a tinyddp "
                          "store answers at once, unless its process is stopped): it is not a tinyddp store " +
                          holder,
                      0) == 0,
        message);
    CHECK(took < 5s);
  }
}
