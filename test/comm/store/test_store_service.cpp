// The store as a service on a network: it listens on loopback unless told otherwise; exposed, it
// wants a token (tinyddp-store refuses to start without one, the library warns); a flood of idle
// connections neither fills its file table nor keeps an honest client out; and a flood of
// misbehaviour costs its log a few lines and a count, not one line per offender.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <mutex>
#include <thread>

#include "tinyddp/comm/store/store_server.h"
#include "tinyddp/comm/store/tcp_store.h"
#include "tinyddp/core/error.h"
#include "tinyddp/core/log_rate_limiter.h"
#include "test/comm/helpers/child_process.h"

using namespace tinyddp;
using namespace tinyddp::comm;
using namespace std::chrono_literals;
using namespace tinyddp::testing;

namespace {

const std::string kBin = TINYDDP_BIN_DIR;

// A TCP connection to address:port that sends nothing; -1 when refused.
int connect_silently(const std::string& address, int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(port));
  inet_pton(AF_INET, address.c_str(), &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

struct CapturedLog {
  std::mutex mutex;
  std::vector<std::string> lines;
  LogSink sink() {
    return [this](LogLevel, const std::string& line) {
      std::lock_guard<std::mutex> lock(mutex);
      lines.push_back(line);
    };
  }
  size_t count(const std::string& needle) {
    std::lock_guard<std::mutex> lock(mutex);
    size_t n = 0;
    for (const auto& l : lines) n += l.find(needle) != std::string::npos;
    return n;
  }
  std::string text() {
    std::lock_guard<std::mutex> lock(mutex);
    std::string all;
    for (const auto& l : lines) all += l + "\n";
    return all;
  }
};

TcpStoreOptions client(const std::string& token, std::chrono::milliseconds timeout = 10s) {
  TcpStoreOptions options;
  options.token = token;
  options.timeout = timeout;
  return options;
}

int port_from_banner(const std::string& banner) { return std::stoi(banner.substr(banner.rfind(':') + 1)); }

}  // namespace

TEST_CASE("store service: tinyddp-store listens on 127.0.0.1 by default, nowhere else") {
  Child store = spawn_program({kBin + "/tinyddp-store", "--port", "0"}, {"TINYDDP_TOKEN="});
  ChildGuard guard{store};
  std::string banner = read_until(store.out_fd, "tinyddp-store listening on", 20s);
  REQUIRE_MESSAGE(!banner.empty(), "tinyddp-store did not start");
  CHECK(banner.find("listening on 127.0.0.1:") != std::string::npos);
  int port = port_from_banner(banner);
  int fd = connect_silently("127.0.0.1", port);
  CHECK(fd >= 0);
  if (fd >= 0) close(fd);
  // Another loopback address of this host reaches a socket bound to every address, but not one
  // bound to 127.0.0.1 alone.
  fd = connect_silently("127.0.0.2", port);
  CHECK_MESSAGE(fd < 0, "the store also answers on 127.0.0.2: it listens on more than 127.0.0.1");
  if (fd >= 0) close(fd);
  kill(store.pid, SIGTERM);
  CHECK(finish_child(store, 20s).exit_code == 0);

  // The library's default is loopback too.
  StoreServer server;
  CHECK(server.host() == "127.0.0.1");
  fd = connect_silently("127.0.0.2", server.port());
  CHECK(fd < 0);
  if (fd >= 0) close(fd);
}

TEST_CASE("store service: exposed, tinyddp-store requires a token, or starts with a warning when told to do without") {
  SUBCASE("no token: it refuses to start, and says what to do") {
    auto refused = finish_child(spawn_program({kBin + "/tinyddp-store", "--host", "0.0.0.0", "--port", "0"},
                                              {"TINYDDP_TOKEN="}),
                                20s);
    CHECK(refused.exit_code == 2);
    CHECK(refused.report.find("refusing to listen on 0.0.0.0 without a token") != std::string::npos);
    CHECK(refused.report.find("hint: export TINYDDP_TOKEN") != std::string::npos);
  }
  SUBCASE("--insecure-no-token: it starts, warning loudly") {
    Child store = spawn_program({kBin + "/tinyddp-store", "--host", "0.0.0.0", "--port", "0", "--insecure-no-token"},
                                {"TINYDDP_TOKEN="});
    ChildGuard guard{store};
    std::string banner = read_until(store.out_fd, "tinyddp-store listening on", 20s);
    REQUIRE(!banner.empty());
    CHECK(banner.find("WARNING") != std::string::npos);
    CHECK(banner.find("WITHOUT A TOKEN") != std::string::npos);
    TcpStore anyone("127.0.0.1", port_from_banner(banner), false, client(""));
    anyone.set("k", "v");
    CHECK(anyone.get("k") == "v");
    kill(store.pid, SIGTERM);
    CHECK(finish_child(store, 20s).exit_code == 0);
  }
  SUBCASE("with a token: it starts without a warning, and a client without the token is turned away") {
    Child store = spawn_program({kBin + "/tinyddp-store", "--host", "0.0.0.0", "--port", "0"},
                                {"TINYDDP_TOKEN=service-secret"});
    ChildGuard guard{store};
    std::string banner = read_until(store.out_fd, "tinyddp-store listening on", 20s);
    REQUIRE(!banner.empty());
    CHECK(banner.find("WARNING") == std::string::npos);
    int port = port_from_banner(banner);
    CHECK_THROWS_WITH_AS(TcpStore("127.0.0.1", port, false, client("", 3s)), doctest::Contains("refused this client"),
                         Error);
    TcpStore member("127.0.0.1", port, false, client("service-secret"));
    member.set("k", "v");
    CHECK(member.get("k") == "v");
    kill(store.pid, SIGTERM);
    auto stopped = finish_child(store, 20s);
    CHECK(stopped.exit_code == 0);
    CHECK(stopped.report.find("WITHOUT A TOKEN") == std::string::npos);
  }
  SUBCASE("the library server warns when it listens beyond loopback with no token") {
    CapturedLog log;
    StoreServerOptions options;
    options.host = "0.0.0.0";
    options.log = log.sink();
    { StoreServer exposed(options); }
    CHECK(log.count("WITHOUT A TOKEN") == 1);
    options.token = "t";
    options.host = "0.0.0.0";
    { StoreServer with_token(options); }
    options.token = "";
    options.host = "127.0.0.1";
    { StoreServer local(options); }
    CHECK(log.count("WITHOUT A TOKEN") == 1);
  }
}

TEST_CASE("store service: a flood of idle connections is capped; an honest client is served; the log stays short") {
  CapturedLog log;
  StoreServerOptions options;
  options.max_pending_hellos = 16;
  options.idle_limit = 60s;  // the flood is not cleared by the idle limit: only the cap can help
  options.log = log.sink();
  options.log_limit = {.burst = 5, .window = 60s};
  StoreServer server(options);

  // Many more silent connections than the cap (and than would fit under a small open-file limit).
  rlimit files{};
  getrlimit(RLIMIT_NOFILE, &files);
  const int flood = int(std::min<rlim_t>(400, files.rlim_cur / 3));
  std::vector<int> silent;
  for (int i = 0; i < flood; ++i)
    if (int fd = connect_silently("127.0.0.1", server.port()); fd >= 0) silent.push_back(fd);
  REQUIRE(int(silent.size()) == flood);
  REQUIRE(eventually([&] { return server.stats().accepted >= uint64_t(flood); }, 20s));

  StoreServerStats during = server.stats();
  CHECK(during.pending_hellos <= 16);
  CHECK(during.evicted >= uint64_t(flood - 16));
  CHECK(during.open <= 16);

  // An honest client, while the flood holds its sockets open: served at once, long before the 60 s
  // idle limit that alone would clear the flood (the bound is loose: the machine may be busy).
  auto start = Clock::now();
  TcpStore honest("127.0.0.1", server.port(), false, client("", 10s));
  honest.set("after-the-flood", "served");
  CHECK(honest.get("after-the-flood") == "served");
  CHECK(Clock::now() - start < 10s);

  // One line for each of the first five evictions, then only a count.
  size_t eviction_lines = log.count("had not completed its hello");
  CHECK_MESSAGE(eviction_lines == 5, log.text());
  StoreServerStats after = server.stats();
  CHECK(after.log_suppressed == after.evicted - 5);
  for (int fd : silent) close(fd);
  server.stop();
  // The count comes out when the server stops (or when the window ends).
  std::string summary = std::to_string(after.evicted - 5) + " more lines like this one";
  CHECK_MESSAGE(log.count(summary) == 1, log.text());
  CHECK(log.text().find(summary) < log.text().rfind("had not completed its hello"));  // it quotes the last one
  CHECK(log.count("had not completed its hello") == 5 + 1);
}

TEST_CASE("store service: the log rate limit lets a burst of each kind through and counts the rest") {
  // A window no run reaches the end of: where each line falls depends on nothing but the count.
  CapturedLog log;
  LogRateLimiter limited(log.sink(), {.burst = 3, .window = std::chrono::hours(1)});
  for (int i = 0; i < 1000; ++i)
    limited.log(LogLevel::warn, "closed 10.0.0." + std::to_string(i % 250) + ":" + std::to_string(40000 + i) +
                                    ": sent no complete hello");
  limited.log(LogLevel::warn, "rejected 10.0.0.1:5: the token presented is wrong");
  CHECK(log.count("sent no complete hello") == 3);
  CHECK(log.count("token presented is wrong") == 1);  // another kind: its own burst
  CHECK(limited.suppressed_total() == 997);
  limited.flush();  // the window has not ended: nothing to say
  CHECK(log.count("more line") == 0);
  limited.flush(true);  // the end: the count comes out, quoting the last line held back
  CHECK(log.count("997 more lines like this one") == 1);
  CHECK(log.text().find("(the last: closed 10.0.0.249:40999: sent no complete hello)") != std::string::npos);
  CHECK(log.count("token presented is wrong") == 1);  // nothing of that kind was held back
}

TEST_CASE("store service: when the log rate limit's window ends, the count comes out and a new burst starts") {
  // Four lines in a 1 s window: only a machine that stalls this thread for a whole second between
  // two calls would put them in two windows.
  CapturedLog log;
  LogRateLimiter limited(log.sink(), {.burst = 3, .window = 1000ms});
  for (int i = 0; i < 4; ++i)
    limited.log(LogLevel::warn, "closed 10.0.0.1:" + std::to_string(40000 + i) + ": sent no complete hello");
  CHECK(log.count("sent no complete hello") == 3);
  limited.flush();
  CHECK(log.count("more line") == 0);   // still inside the window
  std::this_thread::sleep_for(1100ms);  // sleeps at least this long, so the window has ended
  limited.flush();
  CHECK(log.count("1 more line like this one") == 1);
  CHECK(log.text().find("(the last: closed 10.0.0.1:40003: sent no complete hello)") != std::string::npos);
  // A new window: the burst is available again.
  limited.log(LogLevel::warn, "closed 10.0.0.1:1: sent no complete hello");
  CHECK(log.count("sent no complete hello") == 3 + 1 + 1);  // 3, the summary (quoting it), and this one
}
