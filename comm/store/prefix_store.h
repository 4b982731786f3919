// PrefixStore: a namespace inside another store.
//
// Every key is stored as "<prefix>/<key>", so independent users of one store (the rendezvous,
// each process group, each restart of a job) never see each other's keys:
//
//   PrefixStore pg0(store, "pg0");   pg0.set("rank0", "...")   // really sets "pg0/rank0"
//
// Prefixes nest: PrefixStore(PrefixStore(s, "a"), "b") writes "a/b/<key>". The wrapped store must
// outlive the PrefixStore unless it is handed over as a shared_ptr. num_keys() counts the whole
// underlying store: a key-value server cannot count one namespace without listing it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tinyddp/comm/store/store.h"

namespace tinyddp::comm {

class PrefixStore : public Store {
 public:
  PrefixStore(std::shared_ptr<Store> store, std::string prefix);
  // Borrows `store`; the caller keeps it alive.
  PrefixStore(Store& store, std::string prefix);

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

  const std::string& prefix() const { return prefix_; }
  Store& underlying() { return *store_; }

 private:
  std::string key(const std::string& k) const { return prefix_ + "/" + k; }
  std::vector<std::string> keys(const std::vector<std::string>& ks) const;
  // get and multi_get wait with *this* store's timeout, which the wrapped store must use for the call.
  template <typename Call>
  auto with_own_timeout(Call call);

  std::shared_ptr<Store> owned_;
  Store* store_;
  std::string prefix_;
};

}  // namespace tinyddp::comm
