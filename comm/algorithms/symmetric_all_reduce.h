// All-reduce on a symmetric buffer (symmetric/symmetric_buffer.h): every rank of the host reads the
// peers' data where it lies, in their parts of the buffer. No FIFO, no staging copy.
//
// Two-shot (reduce-scatter, then all-gather), n ranks, S bytes, two barriers:
//     1. arrive     every rank publishes its progress counter: its data is ready
//     2. reduce     rank p reduces slice p (the ring's chunk p, chunks.h) of every rank's part into
//        and push   its own part, reading the peers' slices in place, and writes each reduced block
//                   into slice p of every peer's part while the block is in cache: (n-1)S/n read
//                   from peers, (n-1)S/n written to them. No rank reads or writes another's slice p
//                   but p, so the pushes need no barrier before them
//     3. done       barrier: every part holds every reduced slice, and nobody touches this rank's
//                   part any more, so the caller may read and write it
//   Each rank reads S + (n-1)S/n and writes S: (n-1)S/n bytes reduced as a += b, (n-1)S/n copied.
//   (Pulling the slices instead, a gather after a "reduced" barrier, moves the same bytes and costs a
//   third barrier.)
//   The slices are folded in the ring's order (x_p, then x_(p+1), ...), so the result is bitwise
//   the FIFO ring's for sum, avg and prod.
//
// Small messages, where the steps are the cost and not the bytes, go through slot_all_reduce.h
// instead (one barrier), as the FIFO path takes the direct exchange for them.
//
// The barriers are the ranks' progress counters; a wait spins, then sleeps on the shm transport's
// doorbell, checks that the ranks it waits for are alive between sleeps, and ends at the deadline
// with an error naming them and the step they did not reach. Before step 2 every rank checks that
// every peer makes the same call (offset, count, dtype, op, collective number) on the buffer.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tinyddp/comm/algorithms/collective_engine.h"

namespace tinyddp::comm {

class ShmTransport;
class SymmetricBuffer;
struct SymmetricCall;

// The `count` elements of ctx.dtype at `offset` bytes into `buffer`, reduced over every rank of the
// host, in place in every rank's part. Every rank of the group must be on this host: the buffer's
// parties are the whole group.
void symmetric_all_reduce(SymmetricBuffer& buffer, size_t offset, size_t count, ShmTransport& shm,
                          const CollectiveContext& ctx);

// The pieces it is made of, and slot_all_reduce.h, cross_memory_all_reduce.h and
// symmetric_hierarchical_all_reduce.h too:
// the two barriers of a collective in two steps (arrive, done). arrive_at_call throws if the buffer no
// longer maps its peers' parts, publishes `call` with this rank's arrival, waits for every peer's and
// checks that all make the same call; it returns the collective's base step, which depart_from_call
// takes for the done barrier;
uint64_t arrive_at_call(SymmetricBuffer& buffer, const SymmetricCall& call, ShmTransport& shm,
                        const CollectiveContext& ctx);
void depart_from_call(SymmetricBuffer& buffer, uint64_t base, ShmTransport& shm, const CollectiveContext& ctx);
// publishes `step` as this rank's progress on `buffer`, then waits until every peer has reached it;
void symmetric_barrier(SymmetricBuffer& buffer, uint64_t step, ShmTransport& shm, const CollectiveContext& ctx);
// after the arrival step `step`, throws naming the first peer whose call published with it differs
// from `mine` (its address aside: that one is each rank's own; and its op, unless `same_op`: where
// each rank folds into memory of its own, each may fold with its own op, as over the fifos).
void check_same_call(const SymmetricBuffer& buffer, const SymmetricCall& mine, uint64_t step,
                     const CollectiveContext& ctx, bool same_op = true);
// the `count` elements at byte `at` of this rank's part op the same window of every peer's part,
// folded x_me, x_(me+1), ... as the ring folds, a cache-sized block at a time (so that with n > 2
// ranks the partial sum stays in cache between the peers' passes).
// Divided by the world size for avg. With `push_to_peers`, each finished block is also written into the
// same window of every peer's part while it is in cache (fold_block_and_push).
void reduce_symmetric_slice(const SymmetricBuffer& buffer, size_t at, size_t count, const CollectiveContext& ctx,
                            bool push_to_peers = false);
// out = mine op the `count` elements at byte `at` of every peer's part, folded mine, x_(me+1), ... as
// reduce_symmetric_slice folds (avg divided), and the result written into that window of every peer's
// part: the last peer's in the pass that adds its block, the others' by a copy. `mine` is this rank's
// contribution, in its own part or anywhere else (a staged all-reduce's input); `out` may be `mine`.
// The buffer has at least one peer.
void fold_block_and_push(const SymmetricBuffer& buffer, const std::byte* mine, std::byte* out, size_t at, size_t count,
                         const CollectiveContext& ctx);
// out = the `count` elements at byte `at` of every rank's part, folded x_(me+1), x_(me+2), ..., and
// this rank's own x_me last, as the ring reduce-scatter (ring.h) folds the chunk it leaves on this
// rank; no division for avg. `out` may be this rank's own window (in place), or any other memory.
void fold_as_ring_reduce_scatter(const SymmetricBuffer& buffer, size_t at, size_t count, std::byte* out,
                                 const CollectiveContext& ctx);

}  // namespace tinyddp::comm
