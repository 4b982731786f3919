// Which all-reduce algorithm runs, and running it.
//
// Forced by name (ProcessGroupOptions::algorithm, TINYDDP_ALGO, all_reduce_perf --algo) or chosen
// ("auto"):
//   - ranks on one host: the measured size crossover between the one-round direct exchange and the
//     pipelined ring (tuning::kSmallMessageBytes, docs/results.md), as before the other
//     algorithms existed: over shared memory the ring's pipelining beats the step counts the
//     model reasons about;
//   - ranks on several hosts: the algorithm the cost model (cost_model.h) predicts fastest for this
//     size on this host layout, among direct, recursive doubling, Rabenseifner, the ring and, when
//     every host runs the same number (> 1) of ranks, the hierarchical one (whose cross-host step
//     is chosen the same way).
// Every rank must choose the same algorithm for the same call: the choice depends only on the
// size, the layout and the model, and every rank uses rank 0's model (agree_on_model).
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

#include "tinyddp/comm/algorithms/collective_engine.h"
#include "tinyddp/comm/algorithms/cost_model.h"
#include "tinyddp/comm/algorithms/hierarchical_allreduce.h"
#include "tinyddp/comm/algorithms/host_layout.h"
#include "tinyddp/comm/algorithms/peer_group.h"

namespace tinyddp::comm {

class Store;

class AllReduceSelector {
 public:
  AllReduceSelector(AllReduceAlgorithm forced, CostModel model, HostLayout layout, size_t small_message_bytes);

  // The algorithm for an all-reduce of `bytes` per rank (never automatic).
  AllReduceAlgorithm choose(size_t bytes) const;
  // The hierarchical algorithm's cross-host step for `bytes` per rank.
  AllReduceAlgorithm choose_across_hosts(size_t bytes) const;
  // The algorithm named by the options (automatic when none was).
  AllReduceAlgorithm forced() const { return forced_; }
  const CostModel& model() const { return model_; }
  const HostLayout& layout() const { return layout_; }

 private:
  AllReduceAlgorithm forced_;
  CostModel model_;
  HostLayout layout_;
  size_t small_message_bytes_;
};

// The flat all-reduce over a PeerGroup that runs `algorithm` (recursive doubling, Rabenseifner; the
// ring for any other): how the hierarchical algorithm runs the cross-host step the selector chose.
GroupAllReduce flat_algorithm(AllReduceAlgorithm algorithm);

// The algorithm named by `option` (ProcessGroupOptions::algorithm; empty: TINYDDP_ALGO, else auto).
AllReduceAlgorithm algorithm_from_options(const std::string& option);

// Rank 0 publishes its model under `key`; every rank returns rank 0's, so every rank decides alike
// even when their TINYDDP_COST_MODEL files differ.
CostModel agree_on_model(Store& store, const std::string& key, int rank, const CostModel& mine,
                         std::chrono::milliseconds timeout);

// out = in reduced over every rank with the algorithm `selector` chooses for its size; the
// connections are asked for as the algorithm needs them. `out` may be `in`.
void run_all_reduce(const AllReduceSelector& selector, const ConnectionLookup& connection_to, int rank,
                    const std::byte* in, std::byte* out, size_t count, const CollectiveContext& ctx);

}  // namespace tinyddp::comm
