// The hierarchical all-reduce (hierarchical_allreduce.h) with its in-host phases on a symmetric
// buffer (symmetric/symmetric_buffer.h): inside each host the ranks read and write each other's
// parts where they lie, and only the cross-host step moves bytes through a transport.
//
// H hosts of L ranks, S bytes per rank, the tensor in every rank's part of the host's buffer:
//     1. arrive     barrier of the host's ranks: every part holds its rank's data
//     2. reduce     local rank j folds part j (S/L bytes: the hierarchical algorithm's part j) of
//                   every local part into its own part, reading the peers' in place
//     3. across     the H ranks with local index j all-reduce part j over the network (the flat
//                   algorithm the selector chose), in place in the symmetric part
//     4. push       local rank j writes its finished part j into every local peer's part
//     5. done       barrier: every part holds every finished part, and nobody touches this rank's
//                   part any more
//   No rank but j reads or writes part j of any part between the barriers, so steps 2-4 need no
//   barrier of their own: a rank whose network step ends first pushes while the others still work.
//   Per rank, inside the host: (L-1)S/L read from peers and reduced as a += b, (L-1)S/L written to
//   them. The FIFO version (a ring reduce-scatter and a ring all-gather) copies each of those bytes
//   twice, into a fifo and out of it.
//
// Part j is folded x_(j+1), x_(j+2), ..., x_j, as the ring reduce-scatter folds it, and the cross-host
// step runs on the FIFO version's padded part (count rounded up to a multiple of L), so the result is
// bitwise the FIFO version's: a host without symmetric memory may run that one in the same call.
#pragma once

#include <cstddef>

#include "tinyddp/comm/algorithms/hierarchical_allreduce.h"

namespace tinyddp::comm {

class ShmTransport;
class SymmetricBuffer;

// The `count` elements of ctx.dtype at `offset` bytes into `buffer` (whose parties are this rank's
// host), reduced over every rank of `across`'s hosts, in place in every local rank's part.
// `across`: the ranks with this rank's local index, one per host (cross_host_group); `across_hosts`
// runs step 3 among them.
void symmetric_hierarchical_all_reduce(SymmetricBuffer& buffer, size_t offset, size_t count, ShmTransport& shm,
                                       const PeerGroup& across, GroupAllReduce across_hosts,
                                       const CollectiveContext& ctx);

}  // namespace tinyddp::comm
