// Reduce-scatter and all-gather on a symmetric buffer (symmetric/symmetric_buffer.h), every rank on
// one host: the two halves of the two-shot all-reduce (symmetric_all_reduce.h) as collectives of their
// own. ZeRO (nn/optim/zero_redundancy_optimizer.h) keeps its staging buffers in symmetric memory for
// them: the gradients' reduce-scatter reads them there, and the weights' all-gather writes them there.
//
// n ranks, parts of m elements:
//   reduce-scatter   the input is n parts in symmetric memory; the output (any memory, or the input's
//                    own part) gets part `me` reduced over every rank
//     1. arrive      barrier: every rank's input is ready
//     2. fold        part me of every rank's input, read where it lies, folded in the ring
//                    reduce-scatter's order (x_(me+1), ..., x_me), so bitwise the FIFO ring's
//     3. done        barrier: nobody reads this rank's input any more
//     Per rank: (n-1)m added, nothing copied. The FIFO ring copies (n-1)m into fifos and adds (n-1)m.
//   all-gather       the output is n parts in symmetric memory; the input (any memory, or the
//                    output's own part) goes to part `me` of every rank's output
//     1. arrive      barrier: every rank is in the call, so its output may be written
//     2. push        the input copied into part me of every rank's output
//     3. done        barrier: every part of this rank's output has been written
//     Per rank: (n-1)m copied (one m more when the input is not the output's own part). The FIFO ring
//     copies 2(n-1)m: into the fifos and out of them.
#pragma once

#include <cstddef>

#include "tinyddp/comm/algorithms/collective_engine.h"

namespace tinyddp::comm {

class ShmTransport;
class SymmetricBuffer;

// out (count elements) = part `me` of the input (the parties x count elements at `offset` bytes into
// `buffer`), reduced over every rank of the host, which is the whole group.
void symmetric_reduce_scatter(SymmetricBuffer& buffer, size_t offset, size_t count, std::byte* out, ShmTransport& shm,
                              const CollectiveContext& ctx);

// Part p of the output (the parties x count elements at `offset` bytes into `buffer`) on every rank =
// rank p's `in` (count elements).
void symmetric_all_gather(SymmetricBuffer& buffer, size_t offset, size_t count, const std::byte* in, ShmTransport& shm,
                          const CollectiveContext& ctx);

}  // namespace tinyddp::comm
