// All-reduce of ordinary buffers (a user's own tensors) among the ranks of one host, staged through a
// symmetric buffer of the group's that every rank maps (symmetric/symmetric_buffer.h).
//
// A user's tensor lies in no peer's address space, so each rank copies the parts of it its peers
// reduce into its staging half, a window at a time. Slice q is the ring's chunk q (chunks.h), and slot
// q of a rank's half holds its window of slice q. Rank p folds its own window of slice p straight from
// its input with every peer's slot p, and writes the result into its output and back into every
// peer's slot p, where that peer copies it out. A round takes the same window of every slice, so
// every element keeps the rank that folds it, in the ring's order, and the result is bitwise the
// FIFO ring's:
//
//   round j (window j of every slice, in the staging half of the round's parity):
//     1. stage    copy window j of every slice q != p of the input into slot q of this rank's half
//     2. arrive   barrier
//     3. reduce   fold x_p (from the input), x_(p+1), ... (every peer's slot p) into the output, and
//        and push write each finished block into every peer's slot p while it is in cache
//     4. reduced  barrier
//     5. gather   copy slot q of this rank's half (rank q's result) into the output, for every q != p
//
// No barrier ends a round: this rank writes the same half again two rounds later, and every peer
// arrived at the round in between (which this rank waited for) only after its pushes and its gather
// were done. Per rank: (n-1)S/n staged, (n-1)S/n reduced as a += b, (n-1)S/n pushed, (n-1)S/n
// gathered, and two barriers a window. The FIFO ring copies as many bytes, in turns of a FIFO's
// size that sender and receiver must keep in step; process_vm_readv (cross_memory_all_reduce.h)
// copies a third fewer, through the kernel, which pins the peer's pages first.
#pragma once

#include <cstddef>

#include "tinyddp/comm/algorithms/collective_engine.h"

namespace tinyddp::comm {

class ShmTransport;
class SymmetricBuffer;

// out[0, count) = in[0, count) reduced over every rank of the host (in == out is fine). `staging`
// holds two halves; every rank of the group must be on this host, and there are at least two (a
// group of one has no shared memory, so no staging buffer).
void staged_all_reduce(SymmetricBuffer& staging, const std::byte* in, std::byte* out, size_t count, ShmTransport& shm,
                       const CollectiveContext& ctx);

}  // namespace tinyddp::comm
