#include "tinyddp/comm/store/hash_store.h"

#include "tinyddp/core/error.h"

namespace tinyddp::comm {

void HashStore::set(const std::string& key, const std::string& value) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    data_[key] = value;
  }
  changed_.notify_all();
}

std::string HashStore::get(const std::string& key) {
  std::unique_lock<std::mutex> lock(mutex_);
  wait_locked(lock, {key}, timeout_);
  return data_.at(key);
}

int64_t HashStore::add(const std::string& key, int64_t delta) {
  int64_t value = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = data_.find(key);
    if (it != data_.end()) {
      try {
        value = std::stoll(it->second);
      } catch (const std::exception&) {
        TINYDDP_FAIL("HashStore::add: key '", key, "' holds '", it->second, "', which is not an integer",
                     hint("use a key that only add() writes"));
      }
    }
    value += delta;
    data_[key] = std::to_string(value);
  }
  changed_.notify_all();
  return value;
}

std::string HashStore::compare_set(const std::string& key, const std::string& expected, const std::string& desired) {
  std::string result;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = data_.find(key);
    if (it == data_.end()) {
      if (!expected.empty()) return expected;  // PyTorch's semantics: a missing key with a non-empty expectation
      data_[key] = desired;                    // is left missing and `expected` is returned
      result = desired;
    } else if (it->second == expected) {
      it->second = desired;
      result = desired;
    } else {
      return it->second;
    }
  }
  changed_.notify_all();
  return result;
}

bool HashStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& key : keys)
    if (!data_.count(key)) return false;
  return true;
}

void HashStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  wait_locked(lock, keys, timeout);
}

void HashStore::wait_locked(std::unique_lock<std::mutex>& lock, const std::vector<std::string>& keys,
                            Duration timeout) {
  auto all_present = [&] {
    for (const auto& key : keys)
      if (!data_.count(key)) return false;
    return true;
  };
  if (changed_.wait_for(lock, timeout, all_present)) return;
  std::string missing;
  for (const auto& key : keys)
    if (!data_.count(key)) missing += (missing.empty() ? "'" : ", '") + key + "'";
  TINYDDP_FAIL("HashStore: timed out after ", timeout.count(), " ms waiting for key(s) ", missing,
               hint("another rank did not reach the same point (it failed or is stuck), or the timeout is too short"));
}

bool HashStore::delete_key(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  return data_.erase(key) > 0;
}

int64_t HashStore::num_keys() {
  std::lock_guard<std::mutex> lock(mutex_);
  return int64_t(data_.size());
}

void HashStore::append(const std::string& key, const std::string& value) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    data_[key] += value;
  }
  changed_.notify_all();
}

std::vector<std::string> HashStore::multi_get(const std::vector<std::string>& keys) {
  std::unique_lock<std::mutex> lock(mutex_);
  wait_locked(lock, keys, timeout_);
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (const auto& key : keys) values.push_back(data_.at(key));
  return values;
}

void HashStore::multi_set(const std::vector<std::string>& keys, const std::vector<std::string>& values) {
  TINYDDP_CHECK(keys.size() == values.size(), "HashStore::multi_set: ", keys.size(), " keys but ", values.size(),
                " values", hint("pass one value per key"));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 0; i < keys.size(); ++i) data_[keys[i]] = values[i];
  }
  changed_.notify_all();
}

}  // namespace tinyddp::comm
