// Rabenseifner's all-reduce: reduce-scatter by recursive halving, then all-gather by recursive
// doubling. The ring's byte count in log2 p steps instead of 2(n-1): the algorithm for the middle
// sizes, and for large ones when there are many ranks and each step has a real latency.
//
// With p a power of two, the buffer cut into p segments (segment i ends on core rank i):
//   reduce-scatter, log2 p steps, distance p/2, p/4, ..., 1: rank r and r XOR d each hold a
//     window of segments; the one whose bit d is clear keeps the lower half of the window and sends
//     the upper half, the other the reverse; each folds what it receives into the half it keeps.
//     The window halves every step; at the end rank r holds segment r, reduced over every rank.
//   all-gather, log2 p steps, distance 1, 2, ..., p/2: partners swap their windows, which double.
// Other group sizes fold their extra ranks in first (peer_group.h).
//
// Cost, S bytes per rank, n ranks, p = 2^floor(log2 n):
//   steps      2·log2 p                  (+2 when n is not a power of two)
//   sent       2·(p-1)/p · S             per rank (+S on the folded pairs)
//   reduced    (p-1)/p · S               per rank (+S)
//
// Each segment is reduced by exactly one rank and then copied to the others, so every rank ends
// with the same bits, as with the ring.
#pragma once

#include <cstddef>

#include "tinyddp/comm/algorithms/peer_group.h"

namespace tinyddp::comm {

// out = in reduced over every member of `group` (ctx.op; avg divides by ctx.world_size).
// `out` may be `in`. Counts in elements of ctx.dtype.
void rabenseifner_all_reduce(const PeerGroup& group, const std::byte* in, std::byte* out, size_t count,
                             const CollectiveContext& ctx);

}  // namespace tinyddp::comm
