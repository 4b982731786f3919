// HashStore: an in-process Store (a map behind a mutex and a condition variable).
//
// It plays PyTorch's HashStore role: threads that act as ranks inside one process (the collective
// tests) rendezvous through it exactly as processes rendezvous through a TcpStore, so the backends
// are exercised the same way without sockets. Blocking calls honour the store's timeout.
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>

#include "tinyddp/comm/store/store.h"

namespace tinyddp::comm {

class HashStore : public Store {
 public:
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

 private:
  // Waits with the lock held until every key exists; throws naming the missing keys on timeout.
  void wait_locked(std::unique_lock<std::mutex>& lock, const std::vector<std::string>& keys, Duration timeout);

  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::string> data_;
};

}  // namespace tinyddp::comm
