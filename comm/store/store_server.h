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
// Asio stays inside store_server.cpp (pimpl), so this header costs its users nothing.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "comm/store/store_protocol.h"
#include "core/log.h"

namespace tinyddp::comm {

namespace detail {
struct StoreServerState;  // the event loop, the data and the connections (store_server.cpp)
}

struct StoreServerOptions {
  std::string host = "0.0.0.0";  // address to listen on ("::" for every IPv6 address)
  int port = 0;                  // 0: the system picks a free port; read it back with port()
  std::string token;             // when non-empty, a client must present this token in its hello
  protocol::Limits limits;
  // How long a connection may take to send its hello, or the rest of a frame it has started.
  // Between requests a connection may stay idle for ever: ranks sit on their store connection all
  // through training.
  std::chrono::milliseconds idle_limit = std::chrono::seconds(30);
  LogSink log;  // default: stderr, component "store"
};

struct StoreServerStats {
  uint64_t accepted = 0;         // connections accepted
  uint64_t open = 0;             // connections open now
  uint64_t rejected = 0;         // connections closed for a reason (bad input, wrong token, idle, ...)
  uint64_t requests = 0;         // requests executed
  uint64_t waiting = 0;          // get/wait calls parked on missing keys now
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
