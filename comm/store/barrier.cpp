#include "tinyddp/comm/store/barrier.h"

#include <chrono>
#include <set>
#include <sstream>

#include "tinyddp/core/error.h"

namespace tinyddp::comm {

std::string describe_ranks(const std::vector<int>& ranks) {
  constexpr size_t kShown = 12;
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size() && i < kShown; ++i) text += (i ? ", " : "") + std::to_string(ranks[i]);
  if (ranks.size() > kShown) text += ", ... (" + std::to_string(ranks.size() - kShown) + " more)";
  return text;
}

StoreBarrier::StoreBarrier(Store& store, int rank, int world_size, std::string name)
    : store_(store), rank_(rank), world_size_(world_size), name_(std::move(name)) {
  TINYDDP_CHECK(world_size > 0 && rank >= 0 && rank < world_size, "StoreBarrier '", name_, "': rank ", rank,
                " with world size ", world_size, "; hint: ranks run from 0 to world_size - 1");
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
  try {
    store_.wait({base + "/done"}, timeout);
  } catch (const Error&) {
    // Say who is missing, which is what the person reading this needs.
    std::set<int> came;
    std::istringstream list(store_.check({base + "/arrived"}) ? store_.get(base + "/arrived") : "");
    for (std::string r; std::getline(list, r, ',');) came.insert(std::stoi(r));
    std::vector<int> missing;
    for (int r = 0; r < world_size_; ++r)
      if (!came.count(r)) missing.push_back(r);
    double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    TINYDDP_FAIL("barrier '", name_, "' (generation ", g, "): ", came.size(), "/", world_size_, " ranks arrived after ",
                 waited, " s; missing: ", describe_ranks(missing),
                 "; hint: those ranks failed, are stuck earlier in the program, or take a different path through it");
  }
}

}  // namespace tinyddp::comm
