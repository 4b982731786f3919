// Single-rounding reduce-scatter and all-reduce for bf16 and f16: half the bytes of f32 on the
// wire, and one rounding however many ranks there are.
//
// A 16-bit ring rounds at every hop: rank r receives a partial sum in bf16, adds its own value in
// f32 and rounds the result back to bf16 before sending it on, so an element's sum is rounded N-1
// times and the error grows with the world size N (docs/bf16-on-the-wire.md measures it).
//
// Here nothing partial ever travels:
//   1. all-to-all: rank r sends chunk p of its bf16 buffer to rank p, and receives chunk r from
//      every rank, all at once: every rank's own 16-bit values, exactly as they were;
//   2. each rank sums its chunk's N contributions in f32, in rank order (x0 + x1 + ... + x(N-1)),
//      and rounds once to bf16 (avg: the f32 sum divided by N, then rounded once);
//   3. (all-reduce only) a ring all-gather of the rounded chunks, in bf16.
// Each rank sends (N-1)/N of the buffer in step 1 and again in step 3: exactly the bytes of the
// ring all-reduce in bf16, half those of f32. The f32 sum itself rounds to 24 bits after each
// addition; that error is 2^-16 of bf16's for the same sum, so the one rounding to bf16 dominates.
// Every rank computes the same bits for a chunk (one place sums it), as the ring does.
//
// The chunks are those of chunk_begin / chunk_count (comm/chunks.h). Counts in elements of
// ctx.dtype, which must be bf16 or f16; ctx.op sum or avg.
#pragma once

#include <cstddef>
#include <span>

#include "tinyddp/comm/algorithms/ring.h"

namespace tinyddp::comm {

// Whether the single-rounding collectives take `dtype` and `op` (bf16 or f16; sum or avg).
bool single_rounding_supports(DType dtype, ReduceOp op);

// out (chunk_count(count, N, rank) elements) = chunk `rank` of `in` (count elements), summed over
// every rank in f32 and rounded once. `peers[r]` is the connection to rank r (nullptr at `rank`).
void single_rounding_reduce_scatter(std::span<Connection* const> peers, int rank, const std::byte* in, std::byte* out,
                                    size_t count, const CollectiveContext& ctx);

// out (count elements) = in summed over every rank, each element rounded once. `out` may be `in`.
void single_rounding_all_reduce(std::span<Connection* const> peers, const Ring& ring, const std::byte* in,
                                std::byte* out, size_t count, const CollectiveContext& ctx);

}  // namespace tinyddp::comm
