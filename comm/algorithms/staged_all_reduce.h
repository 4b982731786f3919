// All-reduce of ordinary buffers (a user's own tensors) among the ranks of one host, staged through a
// symmetric buffer of the group's that every rank maps (symmetric/symmetric_buffer.h).
//
// A user's tensor lies in no peer's address space, so it is copied into this rank's part of the
// staging buffer a window at a time, and reduced there as the symmetric two-shot reduces
// (symmetric_all_reduce.h). Slice q is the ring's chunk q (chunks.h); a round takes the same window
// of every slice, so every element keeps the rank that folds it, and the result is bitwise the FIFO
// ring's:
//
//   round j (window j of every slice, in the staging half of the round's parity):
//     1. stage    copy window j of every slice of the input into this rank's staging half
//     2. arrive   barrier
//     3. reduce   fold window j of slice p (this rank's) over every rank's staging half, in the
//                 ring's order (x_p, x_(p+1), ...), into this rank's half
//     4. reduced  barrier
//     5. gather   copy window j of every slice q out of rank q's staging half into the output
//
// No barrier ends a round: this rank writes the same half again two rounds later, and every peer
// arrived at the round in between (which this rank waited for) only after its gather was done.
// Per rank: S copied in, (n-1)S/n reduced as a += b, S copied out, and two barriers a window.
// The FIFO ring copies 3(n-1)/n S and reduces (n-1)S/n, in turns of a FIFO's size that both ranks
// must keep in step; process_vm_readv (cross_memory_all_reduce.h) copies least, through the kernel.
#pragma once

#include <cstddef>

#include "tinyddp/comm/algorithms/collective_engine.h"

namespace tinyddp::comm {

class ShmTransport;
class SymmetricBuffer;

// out[0, count) = in[0, count) reduced over every rank of the host (in == out is fine). `staging`
// holds two halves; every rank of the group must be on this host.
void staged_all_reduce(SymmetricBuffer& staging, const std::byte* in, std::byte* out, size_t count, ShmTransport& shm,
                       const CollectiveContext& ctx);

}  // namespace tinyddp::comm
