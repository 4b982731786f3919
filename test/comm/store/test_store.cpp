// The TCP store: every command against a live server, waiting, timeouts, large values, many
// clients, prefix stores, tokens and connection errors.
#include <doctest/doctest.h>

#include <sys/resource.h>

#include <asio.hpp>
#include <atomic>
#include <future>
#include <thread>

#include "tinyddp/comm/store/prefix_store.h"
#include "tinyddp/comm/store/store_server.h"
#include "tinyddp/comm/store/tcp_store.h"
#include "tinyddp/core/error.h"
#include "test/comm/helpers/child_process.h"

using namespace tinyddp;
using namespace tinyddp::comm;
using namespace std::chrono_literals;
using tinyddp::testing::eventually;

namespace {

TcpStoreOptions quick(std::chrono::milliseconds timeout = 10s) {
  TcpStoreOptions options;
  options.timeout = timeout;
  options.token = "";
  options.log = [](LogLevel, const std::string&) {};  // the rejections below are expected; keep the output clean
  return options;
}

// A master store on a free loopback port, and a way to open more clients to it.
struct LiveStore {
  TcpStore master{"127.0.0.1", 0, true, quick()};
  std::unique_ptr<TcpStore> client(std::chrono::milliseconds timeout = 10s) {
    return std::make_unique<TcpStore>("127.0.0.1", master.port(), false, quick(timeout));
  }
  StoreServerStats stats() { return master.server()->stats(); }
};

}  // namespace

TEST_CASE("every store command does what the Store interface says") {
  LiveStore live;
  auto store = live.client();
  Store& s = *store;

  s.set("a", "alpha");
  CHECK(s.get("a") == "alpha");
  s.set("a", "again");
  CHECK(s.get("a") == "again");
  s.set("empty", "");
  CHECK(s.get("empty") == "");
  std::string binary("\0\xff\x01zero", 7);
  s.set("binary", binary);
  CHECK(s.get("binary") == binary);

  CHECK(s.add("n", 5) == 5);
  CHECK(s.add("n", -7) == -2);
  CHECK(s.get("n") == "-2");
  CHECK(s.add("big", int64_t(1) << 62) == int64_t(1) << 62);

  CHECK(s.compare_set("cas", "", "first") == "first");        // missing + expected "" -> set
  CHECK(s.compare_set("cas", "wrong", "second") == "first");  // mismatch -> unchanged
  CHECK(s.compare_set("cas", "first", "second") == "second");
  CHECK(s.get("cas") == "second");
  CHECK(s.compare_set("missing-cas", "x", "y") == "");  // missing + expected "x": stays missing
  CHECK_FALSE(s.check({"missing-cas"}));

  CHECK(s.check({"a", "n"}));
  CHECK_FALSE(s.check({"a", "nope"}));
  s.wait({"a", "n"}, 1s);

  int64_t before = s.num_keys();
  CHECK(before == 6);  // a, empty, binary, n, big, cas
  CHECK(s.delete_key("a"));
  CHECK_FALSE(s.delete_key("a"));
  CHECK(s.num_keys() == before - 1);

  s.append("log", "one;");
  s.append("log", "two;");
  CHECK(s.get("log") == "one;two;");

  s.multi_set({"k1", "k2", "k3"}, {"v1", "v2", "v3"});
  CHECK(s.multi_get({"k3", "k1", "k2"}) == std::vector<std::string>{"v3", "v1", "v2"});
  CHECK(s.multi_get({}).empty());

  // The master is a client of its own server too and sees the same data.
  CHECK(live.master.get("k2") == "v2");
}

TEST_CASE("add on a value that is not an integer fails that call, and the connection carries on") {
  LiveStore live;
  auto store = live.client();
  store->set("text", "twelve");
  CHECK_THROWS_WITH_AS(store->add("text", 1), doctest::Contains("not an integer"), Error);
  store->set("max", std::to_string(INT64_MAX));
  CHECK_THROWS_WITH_AS(store->add("max", 1), doctest::Contains("overflow"), Error);
  CHECK(store->get("text") == "twelve");
}

TEST_CASE("get waits for a key and is answered the moment another client sets it") {
  LiveStore live;
  auto setter = live.client();
  auto getter = live.client();
  auto value = std::async(std::launch::async, [&] { return getter->get("late"); });
  // The get is parked on the server (not polling): the server reports one waiter.
  REQUIRE(eventually([&] { return live.stats().waiting == 1; }));
  setter->set("late", "here");
  REQUIRE(value.wait_for(10s) == std::future_status::ready);
  CHECK(value.get() == "here");
  CHECK(live.stats().waiting == 0);
}

TEST_CASE("a wait with no practical limit (Duration::max) waits, and is answered") {
  LiveStore live;
  auto waiter = live.client();
  waiter->set_timeout(Store::Duration::max());
  auto waited = std::async(std::launch::async, [&] {
    waiter->wait({"forever"}, Store::Duration::max());
    return waiter->get("forever");
  });
  REQUIRE(eventually([&] { return live.stats().waiting == 1; }));
  live.master.set("forever", "now");
  REQUIRE(waited.wait_for(10s) == std::future_status::ready);
  CHECK(waited.get() == "now");
}

TEST_CASE("many concurrent waiters on one key are all answered by one set") {
  LiveStore live;
  constexpr int kWaiters = 16;
  std::vector<std::unique_ptr<TcpStore>> clients;
  for (int i = 0; i < kWaiters; ++i) clients.push_back(live.client());
  std::vector<std::future<std::string>> got;
  for (int i = 0; i < kWaiters; ++i)
    got.push_back(std::async(std::launch::async, [&, i] {
      if (i % 2) return clients[i]->get("go");
      clients[i]->wait({"go", "also"}, 10s);
      return clients[i]->get("also");
    }));
  REQUIRE(eventually([&] { return live.stats().waiting == kWaiters; }));
  live.master.set("go", "now");
  // Half still wait for "also".
  REQUIRE(eventually([&] { return live.stats().waiting == kWaiters / 2; }));
  live.master.set("also", "too");
  for (int i = 0; i < kWaiters; ++i) {
    REQUIRE(got[i].wait_for(10s) == std::future_status::ready);
    CHECK(got[i].get() == (i % 2 ? "now" : "too"));
  }
}

TEST_CASE("a wait that times out names the missing keys, and the connection stays usable") {
  LiveStore live;
  auto store = live.client();
  store->set("present", "1");
  try {
    store->wait({"present", "absent1", "absent2"}, 200ms);
    FAIL("wait did not time out");
  } catch (const Error& e) {
    std::string m = e.message();
    CHECK(m.find("timed out after 0.2 s") != std::string::npos);
    CHECK(m.find("still missing: 'absent1', 'absent2';") != std::string::npos);
    CHECK(m.find("127.0.0.1:" + std::to_string(live.master.port())) != std::string::npos);
    CHECK_FALSE(e.hint().empty());
  }
  // The timed-out waiter is gone from the server: setting its keys later sends no stray answer,
  // so the next answers on this connection are the right ones.
  CHECK(live.stats().waiting == 0);
  live.master.set("absent1", "x");
  live.master.set("absent2", "y");
  CHECK(store->get("absent2") == "y");
  CHECK(store->add("counter", 3) == 3);
  store->set_timeout(100ms);
  CHECK_THROWS_WITH_AS(store->get("never"), doctest::Contains("still missing: 'never'"), Error);
  CHECK(store->get("absent1") == "x");
  CHECK_THROWS_WITH_AS(store->multi_get({"absent1", "never2"}), doctest::Contains("'never2'"), Error);
  store->wait({"absent1"}, 0ms);  // present keys need no time at all
  CHECK_THROWS_AS(store->wait({"never"}, 0ms), Error);
}

TEST_CASE("large values travel intact; values over the limit are refused with the limit named") {
  TcpStoreOptions options = quick();
  options.limits.max_value_bytes = 16u << 20;
  TcpStore master("127.0.0.1", 0, true, options);
  TcpStore client("127.0.0.1", master.port(), false, quick());

  std::string big(16u << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = char((i * 2654435761u) >> 13);
  client.set("big", big);
  CHECK(master.get("big") == big);
  std::vector<std::string> quarters(4, std::string(3u << 20, 'q'));
  client.multi_set({"q0", "q1", "q2", "q3"}, quarters);
  CHECK(master.multi_get({"q0", "q1", "q2", "q3"}) == quarters);

  CHECK_THROWS_WITH_AS(client.set("too-big", std::string((16u << 20) + 1, 'x')),
                       doctest::Contains("over the store's limit of 16777216 bytes; hint: split the value over several "
                                         "keys, or raise the store's limit (TcpStoreOptions::limits where rank 0 hosts "
                                         "it, tinyddp-store --max-value-bytes)"),
                       Error);
  CHECK_THROWS_WITH_AS(client.append("big", "one byte too many"), doctest::Contains("would grow"), Error);
  CHECK_THROWS_WITH_AS(client.set(std::string(5000, 'k'), "v"), doctest::Contains("over the limit of 4096"), Error);
  // Two maximal values do not fit in one multi_get answer: an error, not a dropped connection.
  client.set("big2", big);
  CHECK_THROWS_WITH_AS(client.multi_get({"big", "big2"}), doctest::Contains("frame limit"), Error);
  CHECK(client.get("q0") == quarters[0]);
}

TEST_CASE("many clients at once: every connection served, every add counted") {
  LiveStore live;
  constexpr int kThreads = 16, kClientsPerThread = 16;
  std::vector<std::vector<std::unique_ptr<TcpStore>>> clients(kThreads);
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int c = 0; c < kClientsPerThread; ++c) clients[t].push_back(live.client());
      for (int c = 0; c < kClientsPerThread; ++c) {
        std::string key = "client/" + std::to_string(t) + "/" + std::to_string(c);
        clients[t][c]->set(key, key);
        clients[t][c]->add("counter", 1);
        if (clients[t][(c + 1) % kClientsPerThread]->get(key) != key) wrong++;
      }
    });
  for (auto& t : threads) t.join();
  CHECK(wrong == 0);
  CHECK(live.master.get("counter") == std::to_string(kThreads * kClientsPerThread));
  CHECK(live.stats().open == uint64_t(kThreads * kClientsPerThread + 1));
  CHECK(live.stats().rejected == 0);
}

TEST_CASE("a thousand idle connections are held, and the next client is served at once") {
  // Each connection costs a descriptor here and one in the server: raise the soft limit if we may.
  rlimit files{};
  getrlimit(RLIMIT_NOFILE, &files);
  files.rlim_cur = files.rlim_max;
  setrlimit(RLIMIT_NOFILE, &files);
  getrlimit(RLIMIT_NOFILE, &files);
  size_t idle = std::min<size_t>(1000, files.rlim_cur > 200 ? (files.rlim_cur - 100) / 2 : 0);
  if (idle < 1000) MESSAGE("only ", idle, " idle connections: the open-file limit is ", files.rlim_cur);
  LiveStore live;
  std::vector<std::unique_ptr<asio::ip::tcp::socket>> sockets;
  asio::io_context io;
  std::string hello = protocol::encode_hello({protocol::kMagic, protocol::kVersion, ""});
  for (size_t i = 0; i < idle; ++i) {
    auto socket = std::make_unique<asio::ip::tcp::socket>(io);
    socket->connect({asio::ip::make_address("127.0.0.1"), uint16_t(live.master.port())});
    asio::write(*socket, asio::buffer(hello));
    sockets.push_back(std::move(socket));
  }
  REQUIRE(eventually([&] { return live.stats().open == idle + 1; }));
  auto late = live.client();
  late->set("k", "v");
  CHECK(late->get("k") == "v");
  CHECK(live.stats().rejected == 0);
  sockets.clear();
  CHECK(eventually([&] { return live.stats().open == 2; }));
}

TEST_CASE("prefix stores keep namespaces apart and nest") {
  LiveStore live;
  auto shared = std::shared_ptr<Store>(live.client());
  PrefixStore a(shared, "a");
  PrefixStore b(shared, "b");
  PrefixStore ab(a, "inner");
  a.set("key", "from a");
  b.set("key", "from b");
  ab.set("key", "from a/inner");
  CHECK(a.get("key") == "from a");
  CHECK(b.get("key") == "from b");
  CHECK(shared->get("a/key") == "from a");
  CHECK(shared->get("a/inner/key") == "from a/inner");
  CHECK(a.add("n", 2) == 2);
  CHECK(b.add("n", 5) == 5);
  CHECK(a.compare_set("n", "2", "3") == "3");
  CHECK(a.check({"key", "n"}));
  CHECK_FALSE(b.check({"inner/key"}));
  a.append("log", "x");
  a.multi_set({"m1", "m2"}, {"1", "2"});
  CHECK(a.multi_get({"m2", "m1"}) == std::vector<std::string>{"2", "1"});
  CHECK(shared->get("a/m1") == "1");
  CHECK(a.delete_key("log"));
  CHECK_FALSE(b.delete_key("log"));
  a.wait({"key"}, 1s);
  // Timeouts name the key as the server knows it, prefix included, and use the prefix store's own timeout.
  b.set_timeout(100ms);
  CHECK_THROWS_WITH_AS(b.get("nothing"), doctest::Contains("'b/nothing'"), Error);
  CHECK(shared->timeout() == 10s);
}

TEST_CASE("a token is required when the server has one") {
  TcpStoreOptions options = quick();
  options.token = "s3cret";
  TcpStore master("127.0.0.1", 0, true, options);
  TcpStore good("127.0.0.1", master.port(), false, options);
  good.set("k", "v");
  TcpStoreOptions wrong = quick(2s);
  wrong.token = "guess";
  CHECK_THROWS_WITH_AS(TcpStore("127.0.0.1", master.port(), false, wrong),
                       doctest::Contains("refused this client: the token presented is wrong"), Error);
  CHECK_THROWS_WITH_AS(TcpStore("127.0.0.1", master.port(), false, quick(2s)),
                       doctest::Contains("no token was presented"), Error);
  CHECK(good.get("k") == "v");
  CHECK(master.server()->stats().rejected == 2);
}

TEST_CASE("a client retries until a late server comes up") {
  // Learn a free port, then let it go so the server can take it a little later.
  int port = 0;
  {
    asio::io_context io;
    asio::ip::tcp::acceptor probe(io, asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
    port = probe.local_endpoint().port();
  }
  auto client = std::async(std::launch::async, [port] {
    TcpStore store("127.0.0.1", port, false, quick(20s));
    return store.get("ready");
  });
  std::this_thread::sleep_for(300ms);
  StoreServerOptions options;
  options.host = "127.0.0.1";
  options.port = port;
  StoreServer server(options);
  TcpStore master("127.0.0.1", port, false, quick());
  master.set("ready", "yes");
  REQUIRE(client.wait_for(20s) == std::future_status::ready);
  CHECK(client.get() == "yes");
}

TEST_CASE("connecting to nothing fails after the timeout, naming the address and the time waited") {
  int port = 0;
  {
    asio::io_context io;
    asio::ip::tcp::acceptor probe(io, asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
    port = probe.local_endpoint().port();
  }
  try {
    TcpStore("127.0.0.1", port, false, quick(400ms));
    FAIL("connected to a closed port");
  } catch (const Error& e) {
    std::string m = e.message();
    CHECK(m.find("could not connect to the store at 127.0.0.1:" + std::to_string(port)) != std::string::npos);
    CHECK(m.find("gave up after 0.") != std::string::npos);
    CHECK(m.find("Connection refused") != std::string::npos);
    CHECK(m.find("hint: check that") != std::string::npos);
  }
}

TEST_CASE("a port in use is named, with how to pick another") {
  asio::io_context io;
  asio::ip::tcp::acceptor holder(io, asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  int port = holder.local_endpoint().port();
  try {
    TcpStore("127.0.0.1", port, true, quick(1s));
    FAIL("bound a port that is in use");
  } catch (const Error& e) {
    CHECK(std::string(e.message()).find("port " + std::to_string(port) + " on 127.0.0.1 is already in use") !=
          std::string::npos);
    CHECK(std::string(e.message()).find("hint: pick another port") != std::string::npos);
  }
}

TEST_CASE("the store server survives its client going away mid-call, and the client reconnects") {
  TcpStoreOptions options = quick(2s);
  auto server = std::make_unique<TcpStore>("127.0.0.1", 0, true, options);
  int port = server->port();
  TcpStore client("127.0.0.1", port, false, options);
  client.set("k", "v");
  auto parked = std::async(std::launch::async, [&] {
    try {
      client.get("never");
      return std::string("answered");
    } catch (const Error& e) {
      return std::string(e.message());
    }
  });
  REQUIRE(eventually([&] { return server->server()->stats().waiting == 1; }));
  server.reset();  // the store's host exits while a get is parked
  REQUIRE(parked.wait_for(10s) == std::future_status::ready);
  const std::string lost = parked.get();
  CHECK(lost.find("lost the connection") != std::string::npos);
  // The hint names what happened (a token is refused at the hello, never here).
  CHECK_MESSAGE(lost.find("; hint: the process hosting the store (rank 0, tinyddp-run or tinyddp-store) has probably "
                          "exited: its own output says why") != std::string::npos,
                lost);
  // A new server on the same port: the client's next call connects again.
  StoreServerOptions again;
  again.host = "127.0.0.1";
  again.port = port;
  StoreServer restarted(again);
  client.set("k2", "v2");
  CHECK(client.get("k2") == "v2");
}
