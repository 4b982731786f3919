// The ring algorithms: reduce-scatter, all-gather, all-reduce and a chained broadcast, pipelined.
//
// The ranks form a ring (r sends to r+1, receives from r-1). The buffer is cut into one chunk per
// rank. All-reduce is reduce-scatter followed by all-gather:
//
//   reduce-scatter, n-1 steps: in step s, rank r sends chunk (r-s) and adds the chunk (r-s-1) it
//     receives into its own; after n-1 steps rank r holds chunk (r+1) summed over every rank.
//   all-gather, n-1 steps: the finished chunks travel once more around the ring and are copied.
//
// Every rank sends and receives 2(n-1)/n of the buffer, whatever n is: that is the "bus
// bandwidth" factor nccl-tests reports, and why the ring is bandwidth-optimal.
//
// The two streams: what one rank sends is chunk r, then each chunk it received, once reduced. So
// the out-stream is "my first chunk, then the in-stream (reduced) minus its last chunk", and the
// engine (collective_engine.h) pipelines them.
#pragma once

#include <cstddef>

#include "tinyddp/comm/algorithms/collective_engine.h"

namespace tinyddp::comm {

// ---- ring collectives (byte pointers; counts in elements of ctx.dtype) ----
struct Ring {
  int rank;
  int size;
  Connection* next;  // to rank (rank+1) % size
  Connection* prev;  // from rank (rank-1+size) % size
};

// out = in reduced over every rank. `out` may be `in`.
void ring_all_reduce(const Ring& ring, const std::byte* in, std::byte* out, size_t count, const CollectiveContext& ctx);
// out (count_per_rank) = chunk `rank` of in (size * count_per_rank), reduced over every rank.
void ring_reduce_scatter(const Ring& ring, const std::byte* in, std::byte* out, size_t count_per_rank,
                         const CollectiveContext& ctx);
// out (size * count_per_rank) = every rank's in, in rank order. `in` may be out's own slot.
void ring_all_gather(const Ring& ring, const std::byte* in, std::byte* out, size_t count_per_rank,
                     const CollectiveContext& ctx);
// buf (count elements, cut into chunks as chunk_begin / chunk_count cut them) on every rank = chunk i
// of rank i's buf, for every i: each rank's own chunk, gathered in place.
void ring_all_gather_chunks(const Ring& ring, std::byte* buf, size_t count, const CollectiveContext& ctx);
// buf on every rank = buf on `root`; a pipelined chain root -> root+1 -> ... (bytes, not elements).
void chain_broadcast(const Ring& ring, std::byte* buf, size_t bytes, int root, const CollectiveContext& ctx);

}  // namespace tinyddp::comm
