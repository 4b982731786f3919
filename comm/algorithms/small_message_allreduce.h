// Small-message all-reduce: direct exchange, one round.
//
// The ring needs 2(n-1) dependent steps, and for a few kilobytes each step's fixed cost (a wake-up,
// a system call, a cache miss on the peer's counter) is the whole cost. Here every rank sends its
// whole buffer to every other rank at once and folds what it receives: one round trip, n-1 times
// the bytes. That trade wins below a crossover size and loses above it (tuning::kSmallMessageBytes;
// tuning::kSmallMessageBytesTcpPair for two ranks over tcp, where both move the same bytes and
// only the number of steps differs).
//
// Every rank folds the contributions in rank order (x0 op x1 op ... op x(n-1)), so every rank
// computes the bitwise-identical floating-point result, as the ring does.
#pragma once

#include <cstddef>
#include <span>

#include "tinyddp/comm/algorithms/collective_engine.h"

namespace tinyddp::comm {

// `peers[r]` is the connection to rank r (nullptr at `rank`). out = in reduced over every rank;
// `out` may be `in`. Counts in elements of ctx.dtype.
void direct_all_reduce(std::span<Connection* const> peers, int rank, const std::byte* in, std::byte* out, size_t count,
                       const CollectiveContext& ctx);

// out (peers.size() * bytes) = every rank's `bytes` bytes of in, in rank order. Used for the
// DETAIL fingerprints, where a few bytes per rank must reach everyone in one round.
void direct_all_gather(std::span<Connection* const> peers, int rank, const std::byte* in, std::byte* out, size_t bytes,
                       const CollectiveContext& ctx);

}  // namespace tinyddp::comm
