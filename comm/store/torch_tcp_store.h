// TorchTcpStore: a client of PyTorch's TCPStore server, behind our Store interface.
//
// torchrun's agent hosts a TCPStore on MASTER_PORT and tells its workers so
// (TORCHELASTIC_USE_AGENT_STORE=True): a worker that tried to host its own store there would find
// the port taken. So under torchrun, rendezvous("env://") joins the agent's store with this client,
// and keeps its keys under a prefix of its own ("tinyddp/<run id>/<restart>/"), well apart from
// torchrun's ("/worker/attempt_N/", "torchelastic/...").
//
// The wire protocol (torch/csrc/distributed/c10d/TCPStore*.cpp; native byte order, which is little
// endian on every machine we run on):
//
//   request   = u8 command, then its arguments;  string = u64 length, bytes
//   set          key, value                     (no reply)
//   compare_set  key, expected, desired     ->  string: the value after the operation
//   get          key                        ->  string   (the key must exist: wait for it first)
//   add          key, i64 delta             ->  i64 new value
//   check        u64 count, keys            ->  u8 0 = all exist, 1 = not yet
//   wait         u64 count, keys            ->  u8 0 once all exist (unused: see wait_locked)
//   num_keys                                ->  i64
//   delete_key   key                        ->  i64 keys deleted
//   append       key, value                     (no reply; 2.x only)
//
// Two dialects differ in the command numbers and in a greeting:
//   legacy (PyTorch 1.x to 2.0):  set 0, compare_set 1, get 2, add 3, check 4, wait 5, num_keys 6,
//                                  delete_key 8; no greeting.
//   current (PyTorch 2.x):        a greeting first, "validate" (0) and the u32 magic 0x3C85F7CE;
//                                  then set 1, compare_set 2, get 3, add 4, check 5, wait 6,
//                                  num_keys 7, delete_key 8, append 9.
// The server never says which it speaks, and the wrong guess is not harmless: a legacy server reads
// the current greeting as a `set` whose key is a gigabyte long, and stalls every client while it
// waits for it. So the client first asks a question only a legacy server answers and that no server
// misreads: a legacy `check` of zero keys. A legacy server says "ready"; a current one either hangs
// up (its classic backend: the first command must be the greeting) or ignores it (its libuv backend)
// until `probe_timeout`. TINYDDP_TORCH_STORE_PROTOCOL=legacy|current skips the question.
//
// Like TcpStore, every call is bounded by the store's timeout and says what it waited for; a lost
// connection fails the call that noticed it, and the next call connects again.
// Calls from several threads are serialised.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "tinyddp/comm/store/store.h"

namespace tinyddp::comm {

enum class TorchStoreDialect { unknown, legacy, current };
const char* torch_store_dialect_name(TorchStoreDialect dialect);

struct TorchTcpStoreOptions {
  Store::Duration timeout = Store::kDefaultTimeout;  // every call, and the connect retries
  // How long the dialect question waits for a legacy server's answer before deciding it speaks the
  // current dialect. A legacy server answers at once: this is only the room given to a slow one.
  std::chrono::milliseconds probe_timeout = std::chrono::seconds(1);
  // unknown: ask the server (or read TINYDDP_TORCH_STORE_PROTOCOL).
  TorchStoreDialect dialect = TorchStoreDialect::unknown;
};

class TorchTcpStore : public Store {
 public:
  // Connects (retrying until options.timeout) and learns the dialect before returning.
  TorchTcpStore(std::string host, int port, TorchTcpStoreOptions options = {});
  ~TorchTcpStore() override;
  TorchTcpStore(const TorchTcpStore&) = delete;
  TorchTcpStore& operator=(const TorchTcpStore&) = delete;

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
  TorchStoreDialect dialect() const { return dialect_; }

 private:
  enum class Op { set, compare_set, get, add, check, num_keys, delete_key, append };
  using Clock = std::chrono::steady_clock;

  uint8_t code(Op op) const;
  std::string address() const;
  void connect_until(Clock::time_point deadline);
  int open_socket(Clock::time_point deadline, std::string& why);
  TorchStoreDialect ask_dialect(int fd, std::string& why);
  void ensure_connected();
  void disconnect();
  // One request and, when `reply_bytes` is not 0, its fixed-size reply (or a length-prefixed string
  // when it is kStringReply). Throws naming `what` on a lost connection or the deadline.
  static constexpr size_t kStringReply = ~size_t(0);
  std::string exchange(const std::string& request, size_t reply_bytes, Clock::time_point deadline,
                       const std::string& what);
  std::string request(Op op) const;
  // Waits until every key exists; false at the deadline.
  bool wait_locked(const std::vector<std::string>& keys, Clock::time_point deadline, const std::string& what);
  std::string get_locked(const std::string& key, Clock::time_point deadline);
  bool check_locked(const std::vector<std::string>& keys, Clock::time_point deadline);
  std::string compare_set_locked(const std::string& key, const std::string& expected, const std::string& desired);

  std::string host_;
  int port_;
  TorchTcpStoreOptions options_;
  TorchStoreDialect dialect_ = TorchStoreDialect::unknown;
  int fd_ = -1;
  std::mutex mutex_;
};

}  // namespace tinyddp::comm
