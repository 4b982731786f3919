#include "tinyddp/comm/store/tcp_store.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <thread>

#include <asio.hpp>

#include "tinyddp/comm/store/store_server.h"
#include "tinyddp/comm/timeout.h"
#include "tinyddp/comm/transport/port_owner.h"
#include "tinyddp/core/env.h"
#include "tinyddp/core/error.h"
#include "tinyddp/core/short_list.h"

namespace tinyddp::comm {

using asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using namespace protocol;

namespace {

// A waiting call is answered by the server when its own timeout passes; the client allows this much
// more for the answer to arrive before it gives up on the server itself.
constexpr auto kWaitAnswerSlack = std::chrono::seconds(5);
constexpr auto kFirstBackoff = std::chrono::milliseconds(10);
constexpr auto kMaxBackoff = std::chrono::seconds(1);
// Up to 48 bytes as text a person can read: printable ASCII as is, the rest as \xNN.
std::string printable(std::string_view bytes) {
  std::string out;
  for (unsigned char c : bytes.substr(0, 48)) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += char(c);
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    }
  }
  return out + (bytes.size() > 48 ? "..." : "");
}

// now + budget, saturating: a caller may well pass Duration::max() to mean "no limit".
Clock::time_point deadline_after(Store::Duration budget) {
  constexpr Store::Duration kDecade = std::chrono::hours(24 * 365 * 10);
  return Clock::now() + std::clamp(budget, Store::Duration::zero(), kDecade);
}

std::string quoted_list(const std::vector<std::string>& keys, size_t show = 8) {
  return short_list(keys, show, in_quotes);
}

std::string describe(const Request& request) {
  std::string name = command_name(request.command);
  if (request.keys.empty()) return name + "()";
  if (request.keys.size() == 1) return name + "('" + request.keys[0] + "')";
  return name + "(" + std::to_string(request.keys.size()) + " keys: " + quoted_list(request.keys, 3) + ")";
}

std::string choose_listen_host(const std::string& host) {
  if (host == "localhost") return "127.0.0.1";
  asio::error_code ec;
  auto address = asio::ip::make_address(host, ec);
  if (!ec && address.is_loopback()) return host;
  if (!ec && address.is_v6()) return "::";
  return "0.0.0.0";
}

}  // namespace

// The client's socket and the steps of talking over it, each bounded by a deadline. Asio's
// asynchronous calls give us the deadline: we start an operation, run the event loop until the
// operation is done or the deadline passes, and on the deadline close the socket, which aborts it.
class TcpStore::Connection {
 public:
  Connection(std::string host, int port, std::string token, std::chrono::milliseconds hello_silence)
      : host_(std::move(host)), port_(port), token_(std::move(token)), hello_silence_(hello_silence) {}

  bool connected() const { return connected_; }
  const Limits& limits() const { return limits_; }
  std::string address() const { return host_ + ":" + std::to_string(port_); }

  // Tries until the deadline, backing off exponentially (with jitter, so a thousand ranks started
  // together do not knock in lockstep). A rejected hello is final: retrying cannot fix a token.
  void connect(Clock::time_point deadline) {
    auto start = Clock::now();
    auto backoff = std::chrono::duration_cast<Clock::duration>(kFirstBackoff);
    std::minstd_rand jitter(std::random_device{}());
    std::string last_error;
    int attempts = 0;
    const auto interval = progress_interval();
    auto next_report = start + interval;
    for (;;) {
      ++attempts;
      if (try_connect(deadline, last_error)) return;
      auto now = Clock::now();
      if (now >= deadline) break;
      if (now >= next_report) {  // a long wait says what it waits for, once per interval
        next_report += interval;
        log_line(LogLevel::warn, "store",
                 "still trying to connect to the store at " + address() + " after " + seconds_text(now - start) + " (" +
                     std::to_string(attempts) + " attempts, last error: " + last_error + "); giving up after " +
                     seconds_text(deadline - start) + " (TINYDDP_TIMEOUT)");
      }
      auto pause = std::min<Clock::duration>(backoff * (75 + jitter() % 50) / 100, deadline - now);
      std::this_thread::sleep_for(pause);
      backoff = std::min<Clock::duration>(backoff * 2, kMaxBackoff);
    }
    TINYDDP_FAIL(
        "could not connect to the store at ", address(), ": gave up after ", seconds_text(Clock::now() - start),
        " and ", attempts, " attempts (last error: ", last_error, ")",
        hint("check that the store's host (rank 0, tinyddp-run or tinyddp-store) is running and listening "
             "there, that MASTER_ADDR/MASTER_PORT (or tcp://host:port) name it, and that no firewall blocks the port; ",
             timeout_hint(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - start))));
  }

  void disconnect() {
    asio::error_code ignored;
    socket_.close(ignored);
    connected_ = false;
  }

  // Sends one request frame and returns the body of the response frame.
  std::string roundtrip(const std::string& frame, Clock::time_point deadline, const std::string& what) {
    asio::error_code ec;
    bool done = false;
    asio::async_write(socket_, asio::buffer(frame), [&](asio::error_code e, size_t) { ec = e, done = true; });
    run_until(deadline, done, ec, what);
    char prefix[kFrameLengthBytes];
    done = false;
    asio::async_read(socket_, asio::buffer(prefix), [&](asio::error_code e, size_t) { ec = e, done = true; });
    run_until(deadline, done, ec, what);
    uint32_t length = 0;
    try {
      length = decode_frame_length(std::string_view(prefix, kFrameLengthBytes), limits_);
    } catch (...) {
      disconnect();
      throw;
    }
    // The body grows as its bytes arrive, as on the server: a length prefix alone (from a confused or
    // hostile peer on the store's port) cannot make this process allocate gigabytes up front.
    constexpr size_t kChunk = 256 * 1024;
    std::string body;
    while (body.size() < length) {
      const size_t have = body.size();
      body.resize(have + std::min<size_t>(length - have, kChunk));
      done = false;
      asio::async_read(socket_, asio::buffer(body.data() + have, body.size() - have),
                       [&](asio::error_code e, size_t) { ec = e, done = true; });
      run_until(deadline, done, ec, what);
    }
    return body;
  }

 private:
  // Runs the loop until `done` or `deadline`. Throws (after closing the connection) on either a
  // deadline or an I/O error.
  void run_until(Clock::time_point deadline, const bool& done, const asio::error_code& ec, const std::string& what) {
    if (!wait_for(deadline, done)) {
      disconnect();
      TINYDDP_FAIL("store ", what, " at ", address(), ": no answer from the store within the deadline",
                   hint("the store's host may be overloaded or stuck; the next call reconnects"));
    }
    if (ec) {
      disconnect();
      TINYDDP_FAIL("store ", what, " at ", address(), ": lost the connection (", ec.message(), ")",
                   hint("the process hosting the store (rank 0, tinyddp-run or tinyddp-store) has probably "
                        "exited: its own output says why"));
    }
  }

  // True when the operation finished; false when the deadline came first (the operation is then
  // aborted and its handler has run, so nothing refers to our stack any more).
  bool wait_for(Clock::time_point deadline, const bool& done) {
    io_.restart();
    while (!done && io_.run_one_until(deadline) > 0) {}
    if (done) return true;
    asio::error_code ignored;
    socket_.close(ignored);
    resolver_.cancel();
    io_.restart();
    io_.run();
    return false;
  }

  bool try_connect(Clock::time_point deadline, std::string& last_error) {
    disconnect();
    auto give_up = [&](std::string why) {
      disconnect();
      last_error = std::move(why);
      return false;
    };
    // Running out of time is only worth reporting when no attempt has failed for a real reason.
    auto out_of_time = [&](std::string why) { return give_up(last_error.empty() ? std::move(why) : last_error); };
    asio::error_code ec;
    bool done = false;
    tcp::resolver::results_type endpoints;
    resolver_.async_resolve(host_, std::to_string(port_), [&](asio::error_code e, tcp::resolver::results_type r) {
      ec = e, endpoints = std::move(r), done = true;
    });
    if (!wait_for(deadline, done)) return out_of_time("timed out resolving " + host_);
    if (ec) return give_up("cannot resolve '" + host_ + "': " + ec.message());
    done = false;
    asio::async_connect(socket_, endpoints, [&](asio::error_code e, const tcp::endpoint&) { ec = e, done = true; });
    if (!wait_for(deadline, done)) return out_of_time("timed out connecting");
    if (ec) return give_up(ec.message());
    socket_.set_option(tcp::no_delay(true), ec);
    // Asked now: a read that runs out of time closes the socket, and with it the endpoints.
    const auto remote = socket_.remote_endpoint(ec);
    peer_on_this_host_ = !ec &&
                         (remote.address().is_loopback() || remote.address() == socket_.local_endpoint(ec).address());

    // Hello: magic, version, token; the reply carries the server's limits, or why it refuses us.
    std::string hello = encode_hello(Hello{kMagic, kVersion, token_});
    done = false;
    asio::async_write(socket_, asio::buffer(hello), [&](asio::error_code e, size_t) { ec = e, done = true; });
    if (!wait_for(deadline, done)) return out_of_time("timed out sending the hello");
    if (ec) return give_up("hello failed: " + ec.message());
    // The magic first: its four bytes tell a tinyddp store from any other server on the port, and
    // another server is named at once, since no retry can turn it into a store.
    char head[kHelloReplyHeadBytes];
    done = false;
    const auto silence_deadline = std::min(deadline, Clock::now() + hello_silence_);
    asio::async_read(socket_, asio::buffer(head, 4), [&](asio::error_code e, size_t) { ec = e, done = true; });
    if (!wait_for(silence_deadline, done)) {
      if (silence_deadline < deadline)
        not_a_store("accepted the connection but sent no reply to the hello in " + seconds_text(hello_silence_) +
                    " (a tinyddp store answers at once, unless its process is stopped)");
      return out_of_time("timed out waiting for the hello reply");
    }
    if (ec) return give_up("the server closed the connection during the hello (" + ec.message() + ")");
    if (std::string_view(head, 4) != encode_hello(Hello{kMagic, kVersion, ""}).substr(0, 4)) {
      std::string first(head, 4);
      more_bytes(first, Clock::now() + std::chrono::milliseconds(200));
      not_a_store("answered \"" + printable(first) + "\"");
    }
    done = false;
    asio::async_read(socket_, asio::buffer(head + 4, sizeof head - 4),
                     [&](asio::error_code e, size_t) { ec = e, done = true; });
    if (!wait_for(deadline, done)) return out_of_time("timed out waiting for the hello reply");
    if (ec) return give_up("the server closed the connection during the hello (" + ec.message() + ")");
    HelloReply reply;
    uint32_t message_bytes = 0;
    try {
      message_bytes = decode_hello_reply_head(std::string_view(head, kHelloReplyHeadBytes), reply);
    } catch (const Error& e) {
      return give_up(e.message());
    }
    reply.message.resize(message_bytes);
    done = false;
    asio::async_read(socket_, asio::buffer(reply.message), [&](asio::error_code e, size_t) { ec = e, done = true; });
    if (!wait_for(deadline, done)) return out_of_time("timed out reading the hello reply");
    if (ec) return give_up("hello reply cut short: " + ec.message());
    if (reply.status != HelloStatus::ok) {
      disconnect();
      TINYDDP_FAIL("the store at ", address(), " refused this client: ", reply.message);
    }
    limits_.max_key_bytes = reply.max_key_bytes;
    limits_.max_value_bytes = reply.max_value_bytes;
    connected_ = true;
    return true;
  }

  // What else a server that is not a store sends within `until`, for the message; best effort.
  void more_bytes(std::string& text, Clock::time_point until) {
    char buffer[64];
    while (text.size() < 48) {
      asio::error_code ec;
      bool done = false;
      size_t got = 0;
      socket_.async_read_some(asio::buffer(buffer),
                              [&](asio::error_code e, size_t n) { ec = e, got = n, done = true; });
      if (!wait_for(until, done) || ec) return;
      text.append(buffer, got);
    }
  }

  // Fails for good: the port is held by a server that is not a tinyddp store, named where this host's
  // /proc can tell (a port of this host).
  [[noreturn]] void not_a_store(const std::string& what_it_did) {
    const std::string owner = peer_on_this_host_ ? port_owner(port_) : "";
    disconnect();
    TINYDDP_FAIL("the server at ", address(), " ", what_it_did, ": it is not a tinyddp store",
                 owner.empty() ? std::string() : " (the port is held by " + owner + ")",
                 hint("MASTER_ADDR/MASTER_PORT (or tcp://host:port) name another program's port: choose a free "
                      "port, or stop that program"));
  }

  asio::io_context io_;
  tcp::socket socket_{io_};
  tcp::resolver resolver_{io_};
  std::string host_;
  int port_;
  std::string token_;
  std::chrono::milliseconds hello_silence_;
  bool peer_on_this_host_ = false;  // the connected server is on this host: /proc can name it
  Limits limits_;
  bool connected_ = false;
};

std::string TcpStore::token_from_environment() { return env::text("TINYDDP_TOKEN").value_or(""); }

TcpStore::TcpStore(std::string host, int port, bool is_master, TcpStoreOptions options)
    : host_(std::move(host)), port_(port) {
  TINYDDP_CHECK(port >= 0 && port <= 65535, "TcpStore: port ", port, " is out of range",
                hint("use 1..65535", is_master ? ", or 0 to let the system pick a free one" : ""));
  TINYDDP_CHECK(is_master || port != 0, "TcpStore: a client needs the server's port, got 0",
                hint("port 0 only "
                     "makes sense for the master, which then reports the port it got through port()"));
  timeout_ = options.timeout;
  std::string token = options.token ? *options.token : token_from_environment();
  if (is_master) {
    StoreServerOptions server;
    server.host = options.listen_host.empty() ? choose_listen_host(host_) : options.listen_host;
    server.port = port;
    server.token = token;
    server.limits = options.limits;
    server.idle_limit = options.idle_limit;
    server.log = options.log;
    server_ = std::make_unique<StoreServer>(std::move(server));
    port_ = server_->port();
  }
  connection_ = std::make_unique<Connection>(host_, port_, token, options.hello_silence);
  connection_->connect(deadline_after(timeout_));
}

TcpStore::~TcpStore() {
  // The client goes first, so the hosted server sees an orderly goodbye.
  connection_.reset();
  if (!server_) return;
  // Another rank may still have a request to make: the last to reach the final barrier releases the
  // others by setting its key, and only then asks for it itself. So serve on while a client is
  // connected and between requests, for a while at most. (A client parked on a wait nobody left can
  // answer does not hold us: the server's end tells it so at once.)
  const auto deadline = Clock::now() + std::min<Duration>(timeout_, std::chrono::seconds(10));
  for (StoreServerStats s = server_->stats(); s.open > s.waiting && Clock::now() < deadline; s = server_->stats())
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  server_.reset();
}

Response TcpStore::call(const Request& request, Duration wait_timeout) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string what = describe(request);
  if (!connection_->connected()) connection_->connect(deadline_after(timeout_));
  check_request_fits(request, connection_->limits());
  auto deadline = command_waits(request.command)
                      ? deadline_after(std::min<Duration>(wait_timeout, Duration::max() - kWaitAnswerSlack) +
                                       kWaitAnswerSlack)
                      : deadline_after(timeout_);
  std::string body = connection_->roundtrip(encode_request(request), deadline, what);
  Response response;
  try {
    response = decode_response(request.command, body, connection_->limits());
  } catch (...) {
    connection_->disconnect();
    throw;
  }
  if (response.status == Status::error)
    TINYDDP_FAIL("store ", what, " at ", connection_->address(), " failed: ", response.message);
  if (response.status == Status::timeout)
    TINYDDP_FAIL("store ", what, " at ", connection_->address(), " timed out after ", seconds_text(wait_timeout),
                 "; still missing: ", quoted_list(response.values),
                 hint("the process that should set them may have failed or be slow; if it is only slow, raise the "
                      "timeout: TINYDDP_TIMEOUT=<seconds> (or the examples' --timeout, Store::set_timeout)"));
  return response;
}

namespace {
Request make(Command command, std::vector<std::string> keys = {}, std::vector<std::string> values = {}) {
  Request r;
  r.command = command;
  r.keys = std::move(keys);
  r.values = std::move(values);
  return r;
}
uint64_t to_ms(Store::Duration d) { return uint64_t(std::max<int64_t>(0, d.count())); }
}  // namespace

void TcpStore::set(const std::string& key, const std::string& value) { call(make(Command::set, {key}, {value}), {}); }

std::string TcpStore::get(const std::string& key) {
  Request r = make(Command::get, {key});
  r.timeout_ms = to_ms(timeout_);
  return call(r, timeout_).values.at(0);
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  Request r = make(Command::add, {key});
  r.delta = delta;
  return call(r, {}).number;
}

std::string TcpStore::compare_set(const std::string& key, const std::string& expected, const std::string& desired) {
  return call(make(Command::compare_set, {key}, {expected, desired}), {}).values.at(0);
}

bool TcpStore::check(const std::vector<std::string>& keys) { return call(make(Command::check, keys), {}).number != 0; }

void TcpStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  Request r = make(Command::wait, keys);
  r.timeout_ms = to_ms(timeout);
  call(r, timeout);
}

bool TcpStore::delete_key(const std::string& key) { return call(make(Command::delete_key, {key}), {}).number != 0; }

int64_t TcpStore::num_keys() { return call(make(Command::num_keys), {}).number; }

void TcpStore::append(const std::string& key, const std::string& value) {
  call(make(Command::append, {key}, {value}), {});
}

std::vector<std::string> TcpStore::multi_get(const std::vector<std::string>& keys) {
  Request r = make(Command::multi_get, keys);
  r.timeout_ms = to_ms(timeout_);
  return call(r, timeout_).values;
}

void TcpStore::multi_set(const std::vector<std::string>& keys, const std::vector<std::string>& values) {
  TINYDDP_CHECK(keys.size() == values.size(), "TcpStore::multi_set: ", keys.size(), " keys but ", values.size(),
                " values", hint("pass one value per key"));
  call(make(Command::multi_set, keys, values), {});
}

}  // namespace tinyddp::comm
