// StoreServer: the key-value server every rank talks to during rendezvous and bootstrap.
//
// One thread runs an Asio event loop; every connection is a small state machine driven by
// asynchronous reads and writes, so a thousand idle ranks cost a thousand sockets and nothing else.
// A `get` or `wait` for a key that does not exist yet is parked as a Waiter on that key and
// answered the moment some client sets it (no polling), or with `timeout` when its own timer fires.
//
// Whatever a client sends, the server survives it: sizes are checked before anything is allocated,
// and a malformed frame, an unknown command, a wrong token or version, or a connection that stays
// silent past the idle limit closes *that* connection, with the reason logged, and nothing else.
// The wire format is in comm/store/store_protocol.h.
//
// Exposed to a network, it also survives a crowd: at most `max_pending_hellos` connections may be
// open without having completed their hello; when another arrives, the oldest of them is closed. A
// client that means business sends its hello the moment it connects, so it is never the oldest for
// long, and a flood of idle connections cannot fill the file table or keep an honest client out.
// Its log is rate-limited (core/log_rate_limiter.h): a thousand misbehaving clients cost a
// few lines and a count, not a thousand lines. Listening on an address other than loopback without
// a token, it warns that anyone who can reach the port can read and change every key.
//
// Asio stays inside store_server.cpp (pimpl), so this header costs its users nothing.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "tinyddp/comm/store/store_protocol.h"
#include "tinyddp/core/log.h"
#include "tinyddp/core/log_rate_limiter.h"

namespace tinyddp::comm {

namespace detail {
struct StoreServerState;  // the event loop, the data and the connections (store_server.cpp)
}

struct StoreServerOptions {
  // Address to listen on: loopback unless told otherwise ("0.0.0.0" every IPv4 address, "::" every
  // IPv6 one), so a store is not reachable from the network by accident.
  std::string host = "127.0.0.1";
  int port = 0;       // 0: the system picks a free port; read it back with port()
  std::string token;  // when non-empty, a client must present this token in its hello
  protocol::Limits limits;
  // How long a connection may take to send its hello, or the rest of a frame it has started.
  // Between requests a connection may stay idle for ever: ranks sit on their store connection all
  // through training.
  std::chrono::milliseconds idle_limit = std::chrono::seconds(30);
  // Connections open without a completed hello; past this, the oldest of them is closed.
  size_t max_pending_hellos = 256;
  LogSink log;  // default: stderr, component "store"; rate-limited either way
  LogRateLimit log_limit;
};

struct StoreServerStats {
  uint64_t accepted = 0;        // connections accepted
  uint64_t open = 0;            // connections open now
  uint64_t rejected = 0;        // connections closed for a reason (bad input, wrong token, idle, ...)
  uint64_t requests = 0;        // requests executed
  uint64_t waiting = 0;         // get/wait calls parked on missing keys now
  uint64_t pending_hellos = 0;  // connections open now that have not completed their hello
  uint64_t evicted = 0;         // connections closed to make room under max_pending_hellos
  uint64_t log_suppressed = 0;  // log lines held back by the rate limit
};

class StoreServer {
 public:
  // Binds and starts serving on a background thread. Throws when the address cannot be bound,
  // naming the port (the usual cause: another process holds it).
  explicit StoreServer(StoreServerOptions options = {});
  ~StoreServer();  // stop()s
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  int port() const;
  const std::string& host() const;
  StoreServerStats stats() const;
  // Closes the listener and every connection and joins the thread. Idempotent.
  void stop();

 private:
  std::unique_ptr<detail::StoreServerState> state_;
};

}  // namespace tinyddp::comm
