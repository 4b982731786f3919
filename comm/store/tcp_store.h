// TcpStore: the Store every rank of a job shares, over TCP.
//
// Like PyTorch's TCPStore, one process (rank 0, or the launcher, or a standalone tinyddp-store)
// hosts the server, and every process, the host included, talks to it as a client:
//
//   TcpStore store("10.0.0.1", 29500, /*is_master=*/rank == 0);
//   store.set("rank0/address", "...");
//   std::string peer = store.get("rank1/address");   // waits until rank 1 has set it
//
// The client is blocking and every call is bounded by the store's timeout. Connecting retries
// with exponential backoff until the timeout (the server may simply not be up yet), then fails
// with a message that names the address, the time waited and what to check. A lost connection
// fails the call that noticed it; the next call connects again.
//
// Calls from several threads are serialised: one request is in flight per connection.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "tinyddp/comm/store/store.h"
#include "tinyddp/comm/store/store_protocol.h"
#include "tinyddp/core/log.h"

namespace tinyddp::comm {

class StoreServer;

struct TcpStoreOptions {
  Store::Duration timeout = Store::kDefaultTimeout;  // every call, and the connect retries
  // A tinyddp store answers a hello within microseconds (its event loop does nothing that blocks). A
  // server that accepts the connection and then says nothing for this long is another kind of
  // server, waiting for its own protocol's first words, and the client fails saying so instead of
  // retrying until `timeout`. A server that answers with other bytes than a store's fails at once.
  std::chrono::milliseconds hello_silence = std::chrono::seconds(10);
  // The shared secret presented to the server, and required by it when this store hosts it.
  // nullopt: read TINYDDP_TOKEN from the environment (unset or empty: no token).
  std::optional<std::string> token;
  // Server side, used only when is_master:
  protocol::Limits limits;
  std::chrono::milliseconds idle_limit = std::chrono::seconds(30);
  // Where the server listens. Empty: the loopback address when `host` is a loopback name or
  // address (a single-host job is not exposed to the network), every IPv4 address otherwise.
  std::string listen_host;
  LogSink log;  // server's log; default stderr
};

class TcpStore : public Store {
 public:
  // is_master: also start a StoreServer on `port` (0: a free port, see port()). Connects before
  // returning; throws when it cannot within options.timeout, or when the port is taken.
  TcpStore(std::string host, int port, bool is_master, TcpStoreOptions options = {});
  ~TcpStore() override;

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compare_set(const std::string& key, const std::string& expected, const std::string& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, Duration timeout) override;
  using Store::wait;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;
  void append(const std::string& key, const std::string& value) override;
  std::vector<std::string> multi_get(const std::vector<std::string>& keys) override;
  void multi_set(const std::vector<std::string>& keys, const std::vector<std::string>& values) override;

  const std::string& host() const { return host_; }
  int port() const { return port_; }
  bool is_master() const { return server_ != nullptr; }
  // The hosted server (for its stats), or nullptr when this store is only a client.
  StoreServer* server() { return server_.get(); }

  // The token a TcpStore uses when options.token is nullopt: TINYDDP_TOKEN, or "".
  static std::string token_from_environment();

 private:
  class Connection;
  protocol::Response call(const protocol::Request& request, Duration wait_timeout);

  std::string host_;
  int port_ = 0;
  std::unique_ptr<StoreServer> server_;
  std::unique_ptr<Connection> connection_;
  std::mutex mutex_;
};

}  // namespace tinyddp::comm
