#include "tinyddp/comm/store/barrier.h"

#include <algorithm>
#include <chrono>
#include <set>
#include <sstream>

#include "tinyddp/comm/timeout.h"
#include "tinyddp/core/error.h"
#include "tinyddp/core/log.h"
#include "tinyddp/core/short_list.h"

namespace tinyddp::comm {

std::string describe_ranks(const std::vector<int>& ranks) {
  return (ranks.size() == 1 ? "rank " : "ranks ") + short_list(ranks, 12, [](int r) { return std::to_string(r); });
}

StoreBarrier::StoreBarrier(Store& store, int rank, int world_size, std::string name)
    : store_(store),
      rank_(rank),
      world_size_(world_size),
      name_(std::move(name)),
      progress_interval_(progress_interval()) {
  TINYDDP_CHECK(world_size > 0 && rank >= 0 && rank < world_size, "StoreBarrier '", name_, "': rank ", rank,
                " with world size ", world_size, hint("ranks run from 0 to world_size - 1"));
}

void StoreBarrier::arrive_and_wait(Store::Duration timeout) {
  int64_t g = generation_++;
  std::string base = name_ + "/" + std::to_string(g);
  auto start = std::chrono::steady_clock::now();
  store_.append(base + "/arrived", std::to_string(rank_) + ",");
  int64_t arrived = store_.add(base + "/count", 1);
  if (arrived == world_size_) {
    store_.set(base + "/done", "1");
    if (g > 0) {
      std::string previous = name_ + "/" + std::to_string(g - 1);
      for (const char* key : {"/arrived", "/count", "/done"}) store_.delete_key(previous + key);
    }
  }
  // The wait is cut into progress intervals: a long one says who is still missing, once per interval.
  const auto deadline = start + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<Store::Duration>(deadline - std::chrono::steady_clock::now());
    const bool last_slice = left <= progress_interval_;
    try {
      store_.wait({base + "/done"},
                  std::clamp(left, Store::Duration(1), std::max(progress_interval_, Store::Duration(1))));
      return;
    } catch (const Error&) {
      const std::string status = arrival_status(base, start);
      // Say who is missing, which is what the person reading this needs.
      if (last_slice)
        TINYDDP_FAIL("barrier '", name_, "' (generation ", g, "): ", status,
                     hint("those ranks failed, are stuck earlier in the program, or take a different path through "
                          "it; ",
                          timeout_hint(timeout)));
      log_line(LogLevel::warn, "barrier",
               "rank " + std::to_string(rank_) + ": barrier '" + name_ + "' (generation " + std::to_string(g) +
                   "): " + status);
    }
  }
}

// "2/3 ranks arrived after 10.0 s; missing: rank 1"
std::string StoreBarrier::arrival_status(const std::string& base, std::chrono::steady_clock::time_point start) {
  std::set<int> came;
  std::istringstream list(store_.check({base + "/arrived"}) ? store_.get(base + "/arrived") : "");
  for (std::string r; std::getline(list, r, ',');) came.insert(std::stoi(r));
  std::vector<int> missing;
  for (int r = 0; r < world_size_; ++r)
    if (!came.count(r)) missing.push_back(r);
  return std::to_string(came.size()) + "/" + std::to_string(world_size_) + " ranks arrived after " +
         seconds_text(std::chrono::steady_clock::now() - start) + "; missing: " + describe_ranks(missing);
}

}  // namespace tinyddp::comm
