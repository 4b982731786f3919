// Host-ordered broadcast: a chain broadcast whose chain enters each host once.
//
// The pipelined chain (ring.h) moves every byte over each link of the chain
// once, so what counts is how often the chain crosses hosts. Along rank order it crosses at every
// change of host: n-1 times when a launcher places ranks round-robin over the hosts. Along the
// hosts' order (the root, the rest of its host, then each other host's ranks) it crosses H-1 times,
// the fewest possible; on host-major ranks both orders cross H-1 times.
#pragma once

#include <cstddef>

#include "tinyddp/comm/algorithms/host_layout.h"
#include "tinyddp/comm/algorithms/peer_group.h"

namespace tinyddp::comm {

// The chain broadcast of buf (bytes) from world rank `root`, along the hosts' order (see the top).
void host_ordered_broadcast(const HostLayout& layout, const ConnectionLookup& connection_to, int rank, std::byte* buf,
                            size_t bytes, int root, const CollectiveContext& ctx);

}  // namespace tinyddp::comm
