// StoreBarrier: all ranks wait until every one of them has arrived, using nothing but a Store.
//
// It is how ranks line up before the collectives exist (and how PyTorch's store-based barrier
// works). Each use is one *generation* with its own keys, so a barrier can be passed many times:
//
//   name/<g>/arrived   each rank appends "<rank>,"        (who came: for the error message)
//   name/<g>/count     each rank adds 1; the last one sees world_size and sets
//   name/<g>/done      which everyone waits for
//
// The rank that completes generation g deletes the keys of generation g-1: everyone has arrived at
// g, so nobody can still be waiting on g-1. Every rank must pass the same barriers in the same order.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "tinyddp/comm/store/store.h"

namespace tinyddp::comm {

class StoreBarrier {
 public:
  StoreBarrier(Store& store, int rank, int world_size, std::string name = "barrier");

  // Returns once all world_size ranks have arrived at this generation. Throws after `timeout`,
  // naming the ranks that did not arrive; says who is missing every progress interval before that.
  void arrive_and_wait(Store::Duration timeout);
  void arrive_and_wait() { arrive_and_wait(store_.timeout()); }

  int64_t generation() const { return generation_; }

 private:
  Store& store_;
  int rank_;
  int world_size_;
  std::string name_;
  int64_t generation_ = 0;
  std::chrono::milliseconds progress_interval_;

  std::string arrival_status(const std::string& base, std::chrono::steady_clock::time_point start);
};

// "rank 2" or "ranks 1, 4, 7" (at most a dozen, then how many more): how errors name absent ranks.
std::string describe_ranks(const std::vector<int>& ranks);

}  // namespace tinyddp::comm
