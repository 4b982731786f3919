// All-reduce of small messages through slots in symmetric memory: one barrier a call.
//
// Below a few tens of KiB an all-reduce costs its synchronisations, not its bytes. The FIFO path's
// direct exchange sends each rank's input to every peer and waits for theirs; the symmetric
// buffers' two-shot form needs two barriers. Here every rank of the host has two slots in a
// symmetric buffer of the group's (symmetric/symmetric_buffer.h), and a call is:
//
//   1. stage    copy the input into this rank's slot of the call's parity (calls alternate slots)
//   2. arrive   publish the progress counter (and the call), then wait until every peer's reached it
//   3. fold     output = slot of rank 0, op slot of rank 1, ..., in rank order, read where they lie
//
// There is no second barrier: the slot a rank writes at call k+2 was last read by its peers at call
// k, and each peer arrived at call k+1 (which this rank waited for) only after it finished call k.
// The output may be the input, or any tensor: nobody reads it but its owner. So this serves
// ordinary tensors and symmetric ones alike, each rank copies S bytes once and reads n*S.
//
// The fold is the direct exchange's (rank order), so the result is bitwise the FIFO path's.
#pragma once

#include <cstddef>

#include "tinyddp/comm/algorithms/collective_engine.h"

namespace tinyddp::comm {

class ShmTransport;
class SymmetricBuffer;

// How many bytes one call may reduce through `slots` (half its size: two slots).
size_t slot_capacity(const SymmetricBuffer& slots);

// out[0, count) = in[0, count) reduced over every rank of the host (in == out is fine). Every rank of
// the group must be on this host, and count * dtype size at most slot_capacity(slots).
void slot_all_reduce(SymmetricBuffer& slots, const std::byte* in, std::byte* out, size_t count, ShmTransport& shm,
                     const CollectiveContext& ctx);

}  // namespace tinyddp::comm
