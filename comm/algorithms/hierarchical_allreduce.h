// Hierarchical all-reduce: for ranks that share hosts, keep most bytes off the network.
//
// With H hosts of L ranks each (S bytes per rank):
//   1. reduce-scatter inside each host (ring over shared memory): local rank j ends with part j
//      (S/L bytes) reduced over its host;
//   2. all-reduce across hosts among the H ranks with local index j, on part j: L all-reduces at
//      once, each on 1/L of the data (any flat algorithm: ring, recursive doubling, Rabenseifner);
//   3. all-gather inside each host: every rank gets every part.
//
// Cost (α, β per link kind; the cross-host step with a ring):
//   steps        2(L-1) in-host  +  2(H-1) across
//   cross-host   each host sends 2(H-1)/H · S over its network link (L ranks x 2(H-1)/H · S/L),
//                where a flat ring over the same ranks sends 2(n-1)/n · S per host, n = H·L:
//                1.5·S against S for 2 hosts x 2 ranks.
//   in-host      2(L-1)/L · S per rank over shared memory
//   reduced      (L-1)/L · S + (H-1)/H · S/L per rank
//
// Every part is reduced along one fixed tree (the in-host ring, then the cross-host algorithm), and
// then copied, so every rank ends with the same bits. A count that L does not divide is padded to a
// multiple of L in a scratch buffer (the padding's results are thrown away).
#pragma once

#include <cstddef>

#include "tinyddp/comm/algorithms/host_layout.h"
#include "tinyddp/comm/algorithms/peer_group.h"

namespace tinyddp::comm {

// A flat all-reduce over a PeerGroup: the signature of ring_group_all_reduce,
// recursive_doubling_all_reduce and rabenseifner_all_reduce.
using GroupAllReduce = void (*)(const PeerGroup& group, const std::byte* in, std::byte* out, size_t count,
                                const CollectiveContext& ctx);

// The ranks of `rank`'s host, and the ranks with its local index on every host.
PeerGroup host_group(const HostLayout& layout, const ConnectionLookup& connection_to, int rank);
PeerGroup cross_host_group(const HostLayout& layout, const ConnectionLookup& connection_to, int rank);

// out = in reduced over every rank of the layout, as described at the top; `across_hosts` runs step
// 2. Needs a uniform layout (HostLayout::is_uniform). `out` may be `in`.
void hierarchical_all_reduce(const HostLayout& layout, const ConnectionLookup& connection_to, int rank,
                             const std::byte* in, std::byte* out, size_t count, GroupAllReduce across_hosts,
                             const CollectiveContext& ctx);

}  // namespace tinyddp::comm
