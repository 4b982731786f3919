// Store: the key-value interface that rendezvous, barriers and every backend's bootstrap use.
//
// Values are byte strings. Every blocking call honours the store's timeout and throws a
// tinyddp::Error naming the keys it waited for when the timeout passes. Implementations:
//   TcpStore   (comm/store/tcp_store.h)   the client of the Asio server; rank 0 may host the server too
//   TorchTcpStore (comm/store/torch_tcp_store.h) a client of PyTorch's TCPStore (torchrun's agent store)
//   HashStore  (comm/store/hash_store.h)  in-process, for threads acting as ranks in tests
//   PrefixStore (comm/store/prefix_store.h) a namespace over another store
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace tinyddp::comm {

class Store {
 public:
  using Duration = std::chrono::milliseconds;
  static constexpr Duration kDefaultTimeout = std::chrono::minutes(5);

  virtual ~Store() = default;

  virtual void set(const std::string& key, const std::string& value) = 0;
  // Waits (up to timeout()) until `key` exists, then returns its value.
  virtual std::string get(const std::string& key) = 0;
  // Atomically adds `delta` to the integer stored at `key` (missing = 0) and returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Sets `key` to `desired` if its current value is `expected` (or it is missing and expected is "");
  // returns the value after the operation.
  virtual std::string compare_set(const std::string& key, const std::string& expected, const std::string& desired) = 0;
  // True when every key exists (no waiting).
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Waits until every key exists; throws after `timeout`, naming the keys still missing.
  virtual void wait(const std::vector<std::string>& keys, Duration timeout) = 0;
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }
  // Removes `key`; returns whether it existed.
  virtual bool delete_key(const std::string& key) = 0;
  virtual int64_t num_keys() = 0;
  // Appends `value` to the bytes at `key` (creating it).
  virtual void append(const std::string& key, const std::string& value) = 0;
  virtual std::vector<std::string> multi_get(const std::vector<std::string>& keys) = 0;
  virtual void multi_set(const std::vector<std::string>& keys, const std::vector<std::string>& values) = 0;

  Duration timeout() const { return timeout_; }
  void set_timeout(Duration timeout) { timeout_ = timeout; }

 protected:
  Duration timeout_ = kDefaultTimeout;
};

}  // namespace tinyddp::comm
