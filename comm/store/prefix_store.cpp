#include "tinyddp/comm/store/prefix_store.h"

#include "tinyddp/core/error.h"

namespace tinyddp::comm {

PrefixStore::PrefixStore(std::shared_ptr<Store> store, std::string prefix)
    : owned_(std::move(store)), store_(owned_.get()), prefix_(std::move(prefix)) {
  TINYDDP_CHECK(store_ != nullptr, "PrefixStore '", prefix_, "': the store is null", hint("pass a connected store"));
  timeout_ = store_->timeout();
}

PrefixStore::PrefixStore(Store& store, std::string prefix) : store_(&store), prefix_(std::move(prefix)) {
  timeout_ = store_->timeout();
}

std::vector<std::string> PrefixStore::keys(const std::vector<std::string>& ks) const {
  std::vector<std::string> out;
  out.reserve(ks.size());
  for (const auto& k : ks) out.push_back(key(k));
  return out;
}

// The wrapped store's get() waits for *its* timeout. A PrefixStore may have its own (set_timeout),
// so for the waiting calls it lends its timeout to the wrapped store for the duration of the call.
// The lend is not atomic with respect to other threads using the wrapped store directly; callers
// that share one store between threads should give every view the same timeout.
template <typename Call>
auto PrefixStore::with_own_timeout(Call call) {
  Duration saved = store_->timeout();
  if (saved == timeout_) return call();
  store_->set_timeout(timeout_);
  struct Restore {
    Store* store;
    Duration saved;
    ~Restore() { store->set_timeout(saved); }
  } restore{store_, saved};
  return call();
}

void PrefixStore::set(const std::string& k, const std::string& value) { store_->set(key(k), value); }
std::string PrefixStore::get(const std::string& k) {
  return with_own_timeout([&] { return store_->get(key(k)); });
}
int64_t PrefixStore::add(const std::string& k, int64_t delta) { return store_->add(key(k), delta); }
std::string PrefixStore::compare_set(const std::string& k, const std::string& expected, const std::string& desired) {
  return store_->compare_set(key(k), expected, desired);
}
bool PrefixStore::check(const std::vector<std::string>& ks) { return store_->check(keys(ks)); }
void PrefixStore::wait(const std::vector<std::string>& ks, Duration timeout) { store_->wait(keys(ks), timeout); }
bool PrefixStore::delete_key(const std::string& k) { return store_->delete_key(key(k)); }
int64_t PrefixStore::num_keys() { return store_->num_keys(); }
void PrefixStore::append(const std::string& k, const std::string& value) { store_->append(key(k), value); }
std::vector<std::string> PrefixStore::multi_get(const std::vector<std::string>& ks) {
  return with_own_timeout([&] { return store_->multi_get(keys(ks)); });
}
void PrefixStore::multi_set(const std::vector<std::string>& ks, const std::vector<std::string>& values) {
  store_->multi_set(keys(ks), values);
}

}  // namespace tinyddp::comm
