// Recursive doubling all-reduce: the latency-optimal algorithm for small messages.
//
// With p a power of two: in step k (k = 0 .. log2 p - 1) rank r swaps its whole buffer with rank
// r XOR 2^k and both fold the two into one. After step k every rank holds the reduction over the
// 2^(k+1) ranks that agree with it above bit k, so after log2 p steps it holds everything.
// Other group sizes fold their extra ranks in first (peer_group.h).
//
// Cost, S bytes per rank, n ranks, p = 2^floor(log2 n):
//   steps      log2 p            (+2 when n is not a power of two)
//   sent       log2 p · S        per rank (+S on the folded pairs)
//   reduced    log2 p · S        per rank (+S)
// against the ring's 2(n-1) steps and 2(n-1)/n·S bytes: fewer steps, more bytes. It wins where a
// step's latency costs more than S bytes on the wire (comm/algorithms/algorithm_selection.h).
//
// Both partners of a step fold "lower half (op) upper half", so every rank computes the same
// expression tree and the results agree bitwise on every rank, NaNs in max/min included.
#pragma once

#include <cstddef>

#include "tinyddp/comm/algorithms/peer_group.h"

namespace tinyddp::comm {

// out = in reduced over every member of `group` (ctx.op; avg divides by ctx.world_size).
// `out` may be `in`. Counts in elements of ctx.dtype.
void recursive_doubling_all_reduce(const PeerGroup& group, const std::byte* in, std::byte* out, size_t count,
                                   const CollectiveContext& ctx);

}  // namespace tinyddp::comm
