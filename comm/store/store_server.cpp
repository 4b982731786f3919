#include "tinyddp/comm/store/store_server.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <deque>
#include <limits>
#include <list>
#include <optional>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <asio.hpp>

#include "tinyddp/comm/transport/port_owner.h"
#include "tinyddp/core/error.h"

namespace tinyddp::comm {

using asio::ip::tcp;
using namespace protocol;

namespace {

// Compares without an early exit, so the time taken does not tell an attacker how many leading
// bytes of a guessed token were right.
bool same_token(const std::string& a, const std::string& b) {
  size_t n = std::max(a.size(), b.size());
  unsigned diff = a.size() != b.size();
  for (size_t i = 0; i < n; ++i) diff |= unsigned(i < a.size() ? a[i] : 0) ^ unsigned(i < b.size() ? b[i] : 0);
  return diff == 0;
}

std::string endpoint_text(const tcp::socket& socket) {
  asio::error_code ec;
  auto ep = socket.remote_endpoint(ec);
  if (ec) return "(unknown peer)";
  return ep.address().to_string() + ":" + std::to_string(ep.port());
}

// Reads at most this much of a frame body per read: a frame claiming 64 MiB gets memory as its
// bytes actually arrive, not when the claim is made.
constexpr size_t kBodyChunk = 256 * 1024;

}  // namespace

// The names of these two types must be unique in tinyddp::comm: comm/transport/transport.h has a Connection and
// comm/algorithms/collective_engine.h a Waiter, and two classes of one name in one namespace share the mangled
// names of their inline members. The linker then keeps one destructor for both: these were once
// called Connection and Waiter, and every store connection leaked its socket buffers through the
// transport's empty destructor (found by LeakSanitizer).
struct ClientConnection;

// A get/wait/multi_get parked until its keys exist or its timer fires.
struct ParkedRequest {
  std::weak_ptr<ClientConnection> connection;
  Request request;
  asio::steady_timer timer;
  std::vector<std::string> registered;  // the keys it is listed under in StoreServerState::waiters
  bool done = false;

  explicit ParkedRequest(asio::io_context& io) : timer(io) {}
};

struct detail::StoreServerState {
  // Declared first, destroyed last: every socket and timer below belongs to it.
  asio::io_context io;
  tcp::acceptor acceptor{io};
  asio::steady_timer accept_retry{io};
  asio::steady_timer log_flush{io};
  StoreServerOptions options;
  std::unique_ptr<LogRateLimiter> limited_log;
  std::string bound_host;
  int bound_port = 0;
  std::thread thread;
  bool stopped = false;

  std::unordered_map<std::string, std::string> data;
  std::unordered_map<std::string, std::vector<std::shared_ptr<ParkedRequest>>> waiters;
  std::unordered_set<std::shared_ptr<ClientConnection>> connections;
  // The connections that have not completed their hello, oldest first.
  std::list<std::shared_ptr<ClientConnection>> pending_hellos;

  std::atomic<uint64_t> accepted{0}, open{0}, rejected{0}, requests{0}, waiting{0}, pending{0}, evicted{0};

  void log(LogLevel level, const std::string& message) { limited_log->log(level, message); }
  void flush_log_every_window();

  void accept();
  // A new connection joins the pending ones, evicting the oldest when they are at the limit.
  void admit(const std::shared_ptr<ClientConnection>& connection);
  bool exists(const std::string& key) const { return data.count(key) != 0; }
  std::vector<std::string> missing_keys(const Request& request) const;
  // Runs one request. Returns the response, or nothing when the request was parked (a ParkedRequest).
  std::optional<Response> execute(const std::shared_ptr<ClientConnection>& connection, Request request);
  Response answer_now(const Request& request);
  Response answer_add(const Request& request);
  Response answer_compare_set(const Request& request);
  Response answer_append(const Request& request);
  Response answer_multi_get(const Request& request);
  void key_created(const std::string& key);
  void register_waiter(const std::shared_ptr<ParkedRequest>& waiter);
  void unregister_waiter(const std::shared_ptr<ParkedRequest>& waiter);
  void finish_waiter(const std::shared_ptr<ParkedRequest>& waiter, Response response);
};

// One client connection. All of its handlers run on the server's single thread, so nothing here
// needs a lock. It keeps one read outstanding at all times, which is how it notices a client that
// hangs up while its wait is parked.
struct ClientConnection : std::enable_shared_from_this<ClientConnection> {
  detail::StoreServerState& server;
  tcp::socket socket;
  asio::steady_timer deadline;
  std::string peer;
  std::array<char, kHelloHeadBytes> head{};
  std::string token;
  std::string body;
  uint32_t body_length = 0;
  std::deque<std::string> outbox;
  size_t outbox_bytes = 0;
  bool writing = false;
  bool close_after_write = false;
  bool closed = false;
  std::shared_ptr<ParkedRequest> waiter;  // the parked request, if any
  // Where it sits in StoreServerState::pending_hellos until its hello is complete.
  std::optional<std::list<std::shared_ptr<ClientConnection>>::iterator> pending_position;

  ClientConnection(detail::StoreServerState& s, tcp::socket sock)
      : server(s), socket(std::move(sock)), deadline(s.io), peer(endpoint_text(socket)) {}

  void start() {
    asio::error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    arm_deadline("sent no complete hello");
    auto self = shared_from_this();
    asio::async_read(socket, asio::buffer(head.data(), kHelloHeadBytes),
                     [self](asio::error_code ec, size_t n) { self->on_hello_head(ec, n); });
  }

  // A connection that has started a hello or a frame must finish it within the idle limit, or it
  // is holding server memory for nothing (or trying to, one byte a minute).
  void arm_deadline(const char* what) {
    deadline.expires_after(server.options.idle_limit);
    auto self = shared_from_this();
    deadline.async_wait([self, what](asio::error_code ec) {
      if (ec || self->closed) return;
      self->close(std::string(what) + " within the idle limit of " +
                  std::to_string(self->server.options.idle_limit.count()) + " ms");
    });
  }
  void disarm_deadline() { deadline.cancel(); }

  // Read errors: EOF between frames is a client leaving; anything else is worth a line in the log.
  bool read_failed(asio::error_code ec, size_t got, size_t wanted, const char* what) {
    if (!ec) return false;
    if (closed || ec == asio::error::operation_aborted) return true;
    if (ec == asio::error::eof && got == 0 && std::string_view(what) == "frame length") {
      close("", LogLevel::debug);
    } else if (ec == asio::error::eof) {
      close("truncated " + std::string(what) + ": the client hung up after " + std::to_string(got) + " of " +
            std::to_string(wanted) + " bytes");
    } else {
      close("read failed while reading " + std::string(what) + ": " + ec.message());
    }
    return true;
  }

  void on_hello_head(asio::error_code ec, size_t n) {
    if (read_failed(ec, n, kHelloHeadBytes, "hello")) return;
    uint16_t version = 0;
    uint32_t token_bytes = 0;
    try {
      token_bytes = decode_hello_head(std::string_view(head.data(), kHelloHeadBytes), version);
    } catch (const Error& e) {
      return close(e.message());
    }
    token.resize(token_bytes);
    auto self = shared_from_this();
    asio::async_read(socket, asio::buffer(token), [self, version, token_bytes](asio::error_code ec, size_t n) {
      if (self->read_failed(ec, n, token_bytes, "hello token")) return;
      self->on_hello(version);
    });
  }

  // The hello is complete (or the connection is closing): it no longer counts against the limit.
  void leave_pending() {
    if (!pending_position) return;
    server.pending_hellos.erase(*pending_position);
    pending_position.reset();
    server.pending--;
  }

  void on_hello(uint16_t version) {
    disarm_deadline();
    leave_pending();
    HelloReply reply;
    reply.max_key_bytes = server.options.limits.max_key_bytes;
    reply.max_value_bytes = server.options.limits.max_value_bytes;
    std::string reason;
    if (version != kVersion) {
      reply.status = HelloStatus::bad_version;
      reason = "protocol version " + std::to_string(version) + " is not this server's version " +
               std::to_string(kVersion) + "; hint: run the same tinyddp build on every host";
    } else if (!server.options.token.empty() && !same_token(token, server.options.token)) {
      reply.status = HelloStatus::bad_token;
      reason = token.empty()
                   ? "no token was presented, and this server requires one; hint: set TINYDDP_TOKEN to the job's token"
                   : "the token presented is wrong; hint: every rank must see the same TINYDDP_TOKEN as the store";
    }
    reply.message = reason;
    send(encode_hello_reply(reply));
    if (reply.status != HelloStatus::ok) {
      server.rejected++;
      server.log(LogLevel::warn, "rejected " + peer + ": " + reason);
      close_after_write = true;
      return;
    }
    read_frame();
  }

  void read_frame() {
    auto self = shared_from_this();
    asio::async_read(socket, asio::buffer(head.data(), kFrameLengthBytes), [self](asio::error_code ec, size_t n) {
      if (self->read_failed(ec, n, kFrameLengthBytes, "frame length")) return;
      self->on_frame_length();
    });
  }

  void on_frame_length() {
    try {
      body_length = decode_frame_length(std::string_view(head.data(), kFrameLengthBytes), server.options.limits);
    } catch (const Error& e) {
      return close(e.message());
    }
    if (waiter)
      return close("sent a new request while its " + std::string(command_name(waiter->request.command)) +
                   " was still waiting; hint: one request at a time per connection");
    arm_deadline("sent a partial frame and not the rest");
    body.clear();
    read_body_chunk();
  }

  void read_body_chunk() {
    size_t have = body.size();
    size_t chunk = std::min<size_t>(body_length - have, kBodyChunk);
    body.resize(have + chunk);
    auto self = shared_from_this();
    asio::async_read(socket, asio::buffer(body.data() + have, chunk), [self, have](asio::error_code ec, size_t n) {
      if (self->read_failed(ec, have + n, self->body_length, "frame body")) return;
      if (self->body.size() < self->body_length) return self->read_body_chunk();
      self->disarm_deadline();
      self->on_request();
    });
  }

  void on_request() {
    Request request;
    try {
      request = decode_request(body, server.options.limits);
    } catch (const Error& e) {
      return close(e.message());
    }
    body.clear();
    body.shrink_to_fit();  // a one-off 64 MiB value must not stay reserved by an idle connection
    server.requests++;
    Command command = request.command;
    auto self = shared_from_this();
    if (auto response = server.execute(self, std::move(request))) send(encode_response(command, *response));
    if (!closed) read_frame();
  }

  void send(std::string bytes) {
    if (closed) return;
    outbox_bytes += bytes.size();
    outbox.push_back(std::move(bytes));
    // A client that keeps sending but never reads its replies would make us buffer without bound.
    if (outbox_bytes > 2 * server.options.limits.max_frame_bytes())
      return close("does not read its replies (" + std::to_string(outbox_bytes) + " bytes queued)");
    if (!writing) write_next();
  }

  void write_next() {
    writing = true;
    auto self = shared_from_this();
    asio::async_write(socket, asio::buffer(outbox.front()), [self](asio::error_code ec, size_t) {
      self->writing = false;
      if (ec) {
        if (!self->closed && ec != asio::error::operation_aborted)
          self->close("write failed: " + ec.message(), LogLevel::info);
        return;
      }
      self->outbox_bytes -= self->outbox.front().size();
      self->outbox.pop_front();
      if (!self->outbox.empty()) return self->write_next();
      if (self->close_after_write) self->close("", LogLevel::debug);
    });
  }

  // Closes this connection only. An empty reason is a normal goodbye; any other is logged (and
  // counted) because it means a client broke the rules or went silent.
  void close(const std::string& reason, LogLevel level = LogLevel::warn) {
    if (closed) return;
    closed = true;
    if (!reason.empty()) {
      server.rejected++;
      server.log(level, "closed " + peer + ": " + reason);
    }
    if (waiter) {
      auto w = std::move(waiter);
      w->done = true;
      w->timer.cancel();
      server.unregister_waiter(w);
    }
    deadline.cancel();
    leave_pending();
    asio::error_code ignored;
    socket.shutdown(tcp::socket::shutdown_both, ignored);
    socket.close(ignored);
    server.open--;
    server.connections.erase(shared_from_this());
  }
};

void detail::StoreServerState::accept() {
  acceptor.async_accept([this](asio::error_code ec, tcp::socket socket) {
    if (stopped || ec == asio::error::operation_aborted) return;
    if (ec) {
      // Typically EMFILE: out of file descriptors. Try again shortly rather than spin.
      log(LogLevel::error, "accept failed: " + ec.message() + "; hint: raise the open-file limit (ulimit -n)");
      accept_retry.expires_after(std::chrono::milliseconds(100));
      accept_retry.async_wait([this](asio::error_code e) {
        if (!e && !stopped) accept();
      });
      return;
    }
    accepted++;
    auto connection = std::make_shared<ClientConnection>(*this, std::move(socket));
    connections.insert(connection);
    admit(connection);
    open++;  // after admit() closed the oldest pending one: the count never shows cap + 1
    connection->start();
    accept();
  });
}

void detail::StoreServerState::admit(const std::shared_ptr<ClientConnection>& connection) {
  while (!pending_hellos.empty() && pending_hellos.size() >= std::max<size_t>(1, options.max_pending_hellos)) {
    evicted++;
    pending_hellos.front()->close("had not completed its hello when " + std::to_string(options.max_pending_hellos) +
                                  " connections were waiting to; closed the oldest to make room (a flood of idle "
                                  "connections?)");
  }
  connection->pending_position = pending_hellos.insert(pending_hellos.end(), connection);
  pending++;
}

void detail::StoreServerState::flush_log_every_window() {
  log_flush.expires_after(std::max<std::chrono::milliseconds>(options.log_limit.window, std::chrono::milliseconds(10)));
  log_flush.async_wait([this](asio::error_code ec) {
    if (ec || stopped) return;
    limited_log->flush();
    flush_log_every_window();
  });
}

std::vector<std::string> detail::StoreServerState::missing_keys(const Request& request) const {
  std::vector<std::string> missing;
  for (const auto& key : request.keys)
    if (!exists(key)) missing.push_back(key);
  return missing;
}

std::optional<Response> detail::StoreServerState::execute(const std::shared_ptr<ClientConnection>& connection,
                                                          Request request) {
  if (command_waits(request.command) && !missing_keys(request).empty()) {
    auto waiter = std::make_shared<ParkedRequest>(io);
    waiter->connection = connection;
    waiter->request = std::move(request);
    connection->waiter = waiter;
    register_waiter(waiter);
    waiting++;
    // The timer is the server's half of the wait timeout: the client learns "timeout" and which keys
    // were missing, and the connection stays usable.
    // Capped at ten years: a longer duration would overflow the timer's nanoseconds.
    constexpr uint64_t max_ms = uint64_t(24) * 365 * 10 * 3600 * 1000;
    waiter->timer.expires_after(std::chrono::milliseconds(std::min(waiter->request.timeout_ms, max_ms)));
    waiter->timer.async_wait([this, waiter](asio::error_code ec) {
      if (ec || waiter->done) return;
      Response timeout;
      timeout.status = Status::timeout;
      timeout.values = missing_keys(waiter->request);
      finish_waiter(waiter, std::move(timeout));
    });
    return std::nullopt;
  }
  return answer_now(request);
}

namespace {

Response error_response(std::string message) {
  Response r;
  r.status = Status::error;
  r.message = std::move(message);
  return r;
}

}  // namespace

// Runs a request whose keys are all there (or that needs none): one step per command.
Response detail::StoreServerState::answer_now(const Request& q) {
  Response r;
  switch (q.command) {
    case Command::set:
      data[q.keys[0]] = q.values[0];
      key_created(q.keys[0]);
      break;
    case Command::get: r.values = {data.at(q.keys[0])}; break;
    case Command::add: return answer_add(q);
    case Command::compare_set: return answer_compare_set(q);
    case Command::check: r.number = missing_keys(q).empty(); break;
    case Command::wait: break;
    case Command::delete_key: r.number = data.erase(q.keys[0]); break;
    case Command::num_keys: r.number = int64_t(data.size()); break;
    case Command::append: return answer_append(q);
    case Command::multi_get: return answer_multi_get(q);
    case Command::multi_set:
      for (size_t i = 0; i < q.keys.size(); ++i) data[q.keys[i]] = q.values[i];
      for (const auto& key : q.keys) key_created(key);
      break;
  }
  return r;
}

// add: the key's integer (0 when missing) plus the delta; an error for a key that holds no integer
// or a sum that overflows.
Response detail::StoreServerState::answer_add(const Request& q) {
  int64_t current = 0;
  auto it = data.find(q.keys[0]);
  if (it != data.end()) {
    const std::string& text = it->second;
    size_t used = 0;
    try {
      current = std::stoll(text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != text.size())
      return error_response("add: key '" + q.keys[0] + "' holds '" + text.substr(0, 32) +
                            "', which is not an integer; hint: use add only on counters");
  }
  int64_t next = 0;
  if (__builtin_add_overflow(current, q.delta, &next))
    return error_response("add: key '" + q.keys[0] + "' would overflow a 64-bit integer; hint: reset the counter");
  data[q.keys[0]] = std::to_string(next);
  Response r;
  r.number = next;
  key_created(q.keys[0]);
  return r;
}

// compare_set: the desired value replaces the expected one; answers the value after the operation.
Response detail::StoreServerState::answer_compare_set(const Request& q) {
  const std::string &key = q.keys[0], &expected = q.values[0], &desired = q.values[1];
  Response r;
  auto it = data.find(key);
  if (it == data.end()) {
    // A missing key matches an empty `expected`; the value after the operation of a key that
    // stays missing reads as "".
    if (expected.empty()) {
      data[key] = desired;
      key_created(key);
      r.values = {desired};
    } else {
      r.values = {""};
    }
  } else {
    if (it->second == expected) it->second = desired;
    r.values = {it->second};
  }
  return r;
}

// append: the value grows, up to the value limit; a missing key starts empty (and stays missing
// when the first append is refused).
Response detail::StoreServerState::answer_append(const Request& q) {
  const uint64_t max_value = options.limits.max_value_bytes;
  std::string& value = data[q.keys[0]];
  if (value.size() + q.values[0].size() > max_value) {
    const size_t would_be = value.size() + q.values[0].size();
    if (value.empty()) data.erase(q.keys[0]);
    return error_response("append: key '" + q.keys[0] + "' would grow to " + std::to_string(would_be) +
                          " bytes, over the limit of " + std::to_string(max_value) +
                          "; hint: split the data over several keys");
  }
  value += q.values[0];
  key_created(q.keys[0]);
  return Response{};
}

// multi_get: every key's value, as long as they fit one frame together.
Response detail::StoreServerState::answer_multi_get(const Request& q) {
  uint64_t total = 0;
  for (const auto& key : q.keys) total += data.at(key).size() + 4;
  if (total > options.limits.max_frame_bytes())
    return error_response("multi_get: the values add up to " + std::to_string(total) +
                          " bytes, over the frame limit of " + std::to_string(options.limits.max_frame_bytes()) +
                          "; hint: get them in smaller groups");
  Response r;
  for (const auto& key : q.keys) r.values.push_back(data.at(key));
  return r;
}

// A key now exists: every waiter listed under it re-checks; those with all their keys answered now.
void detail::StoreServerState::key_created(const std::string& key) {
  auto it = waiters.find(key);
  if (it == waiters.end()) return;
  auto listed = std::move(it->second);
  waiters.erase(it);
  for (auto& waiter : listed) {
    if (waiter->done) continue;
    std::erase(waiter->registered, key);
    if (missing_keys(waiter->request).empty()) {
      finish_waiter(waiter, answer_now(waiter->request));
    } else {
      // Still missing some (one may even have been deleted meanwhile): list it under those again.
      unregister_waiter(waiter);
      register_waiter(waiter);
    }
  }
}

void detail::StoreServerState::register_waiter(const std::shared_ptr<ParkedRequest>& waiter) {
  for (auto& key : missing_keys(waiter->request)) {
    waiters[key].push_back(waiter);
    waiter->registered.push_back(key);
  }
}

void detail::StoreServerState::unregister_waiter(const std::shared_ptr<ParkedRequest>& waiter) {
  for (const auto& key : waiter->registered) {
    auto it = waiters.find(key);
    if (it == waiters.end()) continue;
    std::erase(it->second, waiter);
    if (it->second.empty()) waiters.erase(it);
  }
  waiter->registered.clear();
  if (waiting > 0 && waiter->done) waiting--;
}

void detail::StoreServerState::finish_waiter(const std::shared_ptr<ParkedRequest>& waiter, Response response) {
  waiter->done = true;
  waiter->timer.cancel();
  unregister_waiter(waiter);
  auto connection = waiter->connection.lock();
  if (!connection || connection->waiter != waiter) return;
  connection->waiter.reset();
  connection->send(encode_response(waiter->request.command, response));
}

StoreServer::StoreServer(StoreServerOptions options) : state_(std::make_unique<detail::StoreServerState>()) {
  detail::StoreServerState& s = *state_;
  if (!options.log) options.log = stderr_log_sink("store");
  s.options = std::move(options);
  s.limited_log = std::make_unique<LogRateLimiter>(s.options.log, s.options.log_limit);
  const std::string& host = s.options.host;
  TINYDDP_CHECK(s.options.port >= 0 && s.options.port <= 65535, "store server: port ", s.options.port,
                " is out of range", hint("use 1..65535, or 0 to let the system pick a free one"));
  asio::error_code ec;
  tcp::endpoint endpoint;
  auto address = asio::ip::make_address(host, ec);
  if (!ec) {
    endpoint = tcp::endpoint(address, uint16_t(s.options.port));
  } else {
    tcp::resolver resolver(s.io);
    auto results = resolver.resolve(host, std::to_string(s.options.port), ec);
    TINYDDP_CHECK(!ec && !results.empty(), "store server: cannot resolve the listen address '", host,
                  "': ", ec.message(), hint("use an IP address of this host, or 0.0.0.0 for all of them"));
    endpoint = *results.begin();
  }
  s.acceptor.open(endpoint.protocol(), ec);
  TINYDDP_CHECK(!ec, "store server: cannot open a socket: ", ec.message(), hint("check the open-file limit"));
  // Lets a restarted job rebind at once while old connections linger in TIME_WAIT. On Linux this
  // still refuses a port that another process is *listening* on, which is the error we want.
  s.acceptor.set_option(tcp::acceptor::reuse_address(true));
  s.acceptor.bind(endpoint, ec);
  if (ec == asio::error::address_in_use) {
    const std::string owner = port_owner(s.options.port);
    TINYDDP_FAIL("store server: port ", s.options.port, " on ", host, " is already in use",
                 owner.empty() ? " (another job, or an earlier run that is still exiting, holds it)" : " by " + owner,
                 hint("pick another port (MASTER_PORT, --master-port, or tcp://host:PORT), or 0 to let the system "
                      "choose; `ss -ltnp 'sport = :",
                      s.options.port, "'` shows who holds it"));
  }
  TINYDDP_CHECK(!ec, "store server: cannot listen on ", host, ":", s.options.port, ": ", ec.message(),
                hint("the address must belong to this host (or use 0.0.0.0)"));
  s.acceptor.listen(asio::socket_base::max_listen_connections, ec);
  TINYDDP_CHECK(!ec, "store server: listen on ", host, ":", s.options.port, " failed: ", ec.message(),
                hint("try another port"));
  s.bound_host = host;
  s.bound_port = s.acceptor.local_endpoint().port();
  if (s.options.token.empty() && !s.acceptor.local_endpoint().address().is_loopback())
    s.log(LogLevel::warn, "listening on " + host + ":" + std::to_string(s.bound_port) +
                              " WITHOUT A TOKEN: any process that can reach this address can read and change every "
                              "key of the jobs here; hint: give the store a token (TINYDDP_TOKEN, or tinyddp-store "
                              "--token) and the same TINYDDP_TOKEN to every rank, or listen on 127.0.0.1");
  s.accept();
  s.flush_log_every_window();
  s.thread = std::thread([&s] {
    try {
      s.io.run();
    } catch (const std::exception& e) {
      s.log(LogLevel::error, std::string("event loop stopped by an exception: ") + e.what());
    }
  });
}

StoreServer::~StoreServer() { stop(); }

void StoreServer::stop() {
  detail::StoreServerState& s = *state_;
  if (!s.thread.joinable()) return;
  asio::post(s.io, [&s] {
    s.stopped = true;
    asio::error_code ignored;
    s.acceptor.close(ignored);
    s.accept_retry.cancel();
    s.log_flush.cancel();
    auto connections = s.connections;  // close() erases from the set
    for (auto& c : connections) c->close("", LogLevel::debug);
    s.io.stop();
  });
  s.thread.join();
  s.connections.clear();
  s.pending_hellos.clear();
  s.waiters.clear();
  s.limited_log->flush(/*all=*/true);
}

int StoreServer::port() const { return state_->bound_port; }
const std::string& StoreServer::host() const { return state_->bound_host; }

StoreServerStats StoreServer::stats() const {
  const detail::StoreServerState& s = *state_;
  StoreServerStats stats;
  stats.accepted = s.accepted;
  stats.rejected = s.rejected;
  stats.requests = s.requests;
  stats.waiting = s.waiting;
  stats.open = s.open;
  stats.pending_hellos = s.pending;
  stats.evicted = s.evicted;
  stats.log_suppressed = s.limited_log->suppressed_total();
  return stats;
}

}  // namespace tinyddp::comm
