#include "tinyddp/comm/algorithms/algorithm_selection.h"

#include <cstring>
#include <limits>

#include "tinyddp/comm/algorithms/hierarchical_allreduce.h"
#include "tinyddp/comm/algorithms/rabenseifner.h"
#include "tinyddp/comm/algorithms/recursive_doubling.h"
#include "tinyddp/comm/algorithms/small_message_allreduce.h"
#include "tinyddp/comm/store/store.h"
#include "tinyddp/core/env.h"

namespace tinyddp::comm {

namespace {

constexpr AllReduceAlgorithm kFlat[] = {AllReduceAlgorithm::ring, AllReduceAlgorithm::direct,
                                        AllReduceAlgorithm::recursive_doubling, AllReduceAlgorithm::rabenseifner};

// The ring keeps its place unless another algorithm is predicted faster by more than this share.
// The model charges every step its full α, but the ring's steps overlap (it streams: a byte goes on
// as soon as it is reduced) while the others' steps wait for one another; so where the model sees
// two algorithms move the same bytes and differ only by a few α (Rabenseifner against the ring on
// large messages), the ring is the faster one measured (docs/results.md).
constexpr double kRingMargin = 0.05;

// The fastest of `candidates` (the ring among them) by the model. The per-call term is left out
// (transfer_seconds): every algorithm pays it, and inside the ring's margin it would tilt the choice.
template <typename Candidates>
AllReduceAlgorithm fastest(const CostModel& model, const HostLayout& layout, double bytes,
                           const Candidates& candidates) {
  const double ring = transfer_seconds(model, all_reduce_traffic(AllReduceAlgorithm::ring, layout, bytes));
  AllReduceAlgorithm best = AllReduceAlgorithm::ring;
  double best_seconds = ring * (1 - kRingMargin);
  for (AllReduceAlgorithm a : candidates) {
    if (a == AllReduceAlgorithm::ring) continue;
    double t = transfer_seconds(model, all_reduce_traffic(a, layout, bytes));
    if (t < best_seconds) best = a, best_seconds = t;
  }
  return best;
}

}  // namespace

GroupAllReduce flat_algorithm(AllReduceAlgorithm a) {
  switch (a) {
    case AllReduceAlgorithm::recursive_doubling: return recursive_doubling_all_reduce;
    case AllReduceAlgorithm::rabenseifner: return rabenseifner_all_reduce;
    default: return ring_group_all_reduce;
  }
}

AllReduceSelector::AllReduceSelector(AllReduceAlgorithm forced, CostModel model, HostLayout layout,
                                     size_t small_message_bytes)
    : forced_(forced), model_(model), layout_(std::move(layout)), small_message_bytes_(small_message_bytes) {}

AllReduceAlgorithm AllReduceSelector::choose(size_t bytes) const {
  if (forced_ != AllReduceAlgorithm::automatic) return forced_;
  if (layout_.hosts() <= 1)
    return bytes <= small_message_bytes_ ? AllReduceAlgorithm::direct : AllReduceAlgorithm::ring;
  AllReduceAlgorithm best = fastest(model_, layout_, double(bytes), kFlat);
  if (layout_.is_uniform() && layout_.per_host() > 1) {
    const AllReduceAlgorithm across = choose_across_hosts(bytes);
    const double flat = transfer_seconds(model_, all_reduce_traffic(best, layout_, double(bytes)));
    const double hier = transfer_seconds(model_, all_reduce_traffic(AllReduceAlgorithm::hierarchical, layout_,
                                                                    double(bytes), across));
    if (hier < flat) best = AllReduceAlgorithm::hierarchical;
  }
  return best;
}

AllReduceAlgorithm AllReduceSelector::choose_across_hosts(size_t bytes) const {
  const AllReduceAlgorithm across[] = {AllReduceAlgorithm::ring, AllReduceAlgorithm::recursive_doubling,
                                       AllReduceAlgorithm::rabenseifner};
  const int L = std::max(1, layout_.per_host());
  return fastest(model_, HostLayout::uniform(layout_.hosts(), 1), double(bytes) / L, across);
}

AllReduceAlgorithm algorithm_from_options(const std::string& option) {
  if (!option.empty()) return algorithm_from_name(option, "ProcessGroupOptions::algorithm");
  if (auto name = env::text("TINYDDP_ALGO")) return algorithm_from_name(*name, "TINYDDP_ALGO");
  return AllReduceAlgorithm::automatic;
}

CostModel agree_on_model(Store& store, const std::string& key, int rank, const CostModel& mine,
                         std::chrono::milliseconds timeout) {
  if (rank == 0) {
    // Rank 0 too uses the model as read back from the text: the units' conversions round, and a
    // model that differs in the last bit could choose differently at a crossover.
    const std::string text = mine.to_text();
    store.set(key, text);
    return CostModel::parse(text, "rank 0's cost model");
  }
  store.wait({key}, timeout);
  return CostModel::parse(store.get(key), "rank 0's cost model");
}

void run_all_reduce(const AllReduceSelector& selector, const ConnectionLookup& connection_to, int rank,
                    const std::byte* in, std::byte* out, size_t count, const CollectiveContext& ctx) {
  const size_t bytes = count * dtype_size(ctx.dtype);
  const int world = selector.layout().world();
  if (world == 1 || bytes == 0) {
    if (out != in && bytes > 0) std::memcpy(out, in, bytes);
    return;
  }
  const AllReduceAlgorithm algorithm = selector.choose(bytes);
  switch (algorithm) {
    case AllReduceAlgorithm::direct: {
      thread_local std::vector<Connection*> peers;  // every peer: the direct exchange talks to all
      peers.assign(size_t(world), nullptr);
      for (int r = 0; r < world; ++r)
        if (r != rank) peers[size_t(r)] = connection_to(r);
      return direct_all_reduce(peers, rank, in, out, count, ctx);
    }
    case AllReduceAlgorithm::hierarchical:
      return hierarchical_all_reduce(selector.layout(), connection_to, rank, in, out, count,
                                     flat_algorithm(selector.choose_across_hosts(bytes)), ctx);
    default: {
      PeerGroup everyone{rank, std::vector<int>(size_t(world)), connection_to};
      for (int r = 0; r < world; ++r) everyone.members[size_t(r)] = r;
      return flat_algorithm(algorithm)(everyone, in, out, count, ctx);
    }
  }
}

}  // namespace tinyddp::comm
