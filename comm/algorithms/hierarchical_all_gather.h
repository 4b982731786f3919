// Hierarchical all-gather: for ranks that share hosts, each byte crosses to a host once, and the
// ranks of a host share the way in.
//
// All-gather, H hosts of L ranks, s bytes per rank (n = H·L):
//   1. across hosts, among the H ranks with local index j: a ring all-gather of their s bytes each
//      (L of these at once); every rank holds the H pieces of its local index;
//   2. inside each host: a ring all-gather of those H·s bytes over shared memory;
//   3. the n pieces are put in rank order.
// Cost:
//   steps        (H-1) across + (L-1) in-host, where a flat ring over the n ranks takes n-1
//   cross-host   each host sends L·(H-1)·s (each of its ranks' pieces once to each other host, over
//                L connections at once); a flat ring over host-major ranks sends (n-1)·s over one
//                connection per host: 3·s against 2·s on 2 hosts x 2 ranks, 7·s against 4·s on 2 x 4
//   in-host      (L-1)·H·s per rank over shared memory, and one copy of n·s to reorder
//   memory       (n + H)·s bytes of scratch per rank, kept for the next call (the flat ring needs
//                none: it gathers straight into the output)
// It pays on every uniform layout with several hosts of several ranks (fewer steps and fewer bytes
// across); with one rank per host or one host it is the flat ring.
//
#pragma once

#include <cstddef>

#include "tinyddp/comm/algorithms/host_layout.h"
#include "tinyddp/comm/algorithms/peer_group.h"

namespace tinyddp::comm {

// Whether the hierarchical all-gather applies: a uniform layout of several hosts of several ranks.
bool hierarchical_all_gather_applies(const HostLayout& layout);

// out (n · count elements) = every rank's in, in rank order, as described at the top. Needs
// hierarchical_all_gather_applies. `in` may be out's own slot.
void hierarchical_all_gather(const HostLayout& layout, const ConnectionLookup& connection_to, int rank,
                             const std::byte* in, std::byte* out, size_t count, const CollectiveContext& ctx);

}  // namespace tinyddp::comm
