// PeerGroup: the ranks an algorithm runs among, and the two pairwise moves the log-step algorithms
// are made of.
//
// The flat algorithms run among every rank of the process group; the hierarchical one runs them
// again among parts of it (the ranks of one host; the ranks with one local index across hosts).
// So an algorithm is written against a PeerGroup: its own index in the group, the members' world
// ranks, and a way to get the connection to one of them (asked only for the peers an algorithm
// talks to: a transport may open connections on first use).
//
// Recursive doubling and Rabenseifner need a power-of-two number of ranks. The standard way to
// handle any other count n (Thakur, Rabenseifner & Gropp 2005): with p the largest power of two
// <= n and e = n - p "extra" ranks, each even rank r < 2e first hands its whole buffer to r+1 and
// sits out; the p remaining ranks (the "core") run the power-of-two algorithm; at the end each odd
// r < 2e hands the result back to r-1. It costs two more steps and 2·S more bytes on those pairs.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "tinyddp/comm/algorithms/ring.h"

namespace tinyddp::comm {

// The connection to a world rank.
using ConnectionLookup = std::function<Connection*(int world_rank)>;

struct PeerGroup {
  int rank = 0;              // this rank's index in the group
  std::vector<int> members;  // world ranks, by group index
  ConnectionLookup connection_to;
  int size() const { return int(members.size()); }
  Connection* peer(int index) const { return connection_to(members[size_t(index)]); }
  // The ring over the group in index order.
  Ring ring() const;
};

// ring_all_reduce over the group in index order, as a flat algorithm over a PeerGroup.
void ring_group_all_reduce(const PeerGroup& group, const std::byte* in, std::byte* out, size_t count,
                           const CollectiveContext& ctx);

// The power-of-two core of a group of `size` ranks, as described at the top.
struct PowerOfTwoCore {
  explicit PowerOfTwoCore(int size);
  int size;   // p
  int extra;  // e = n - p
  // The group rank's index in the core; -1 for an even rank < 2e, which sits out.
  int core_rank(int group_rank) const;
  // The group rank of core index c.
  int group_rank(int core) const;
};

// Sends send[0, send_bytes) to `peer` and receives `recv_bytes` from it into `recv`, both at once.
// Either side may be empty (nullptr connection not allowed; bytes 0 is).
void exchange(Connection* peer, const std::byte* send, size_t send_bytes, std::byte* recv, size_t recv_bytes,
              const CollectiveContext& ctx);

// Sends send[0, send_bytes) to `peer` and at once folds the `fold_bytes` it sends back into
// `dst`: dst = dst (op) incoming, straight out of the transport.
void exchange_and_fold(Connection* peer, const std::byte* send, size_t send_bytes, std::byte* dst, size_t fold_bytes,
                       const CollectiveContext& ctx);

// The first and last step of a non-power-of-two group (see the top): before, an even rank < 2e
// sends `bytes` of buf to r+1, which folds it in (buf = buf (op) received, or received (op) buf
// when `lower_first`, so that the lower rank's value always comes first). After, r+1 sends the
// result back. Both do nothing on the other ranks.
void fold_into_core(const PeerGroup& group, const PowerOfTwoCore& core, std::byte* buf, size_t count, bool lower_first,
                    const CollectiveContext& ctx);
void unfold_from_core(const PeerGroup& group, const PowerOfTwoCore& core, std::byte* buf, size_t count,
                      const CollectiveContext& ctx);

// out = ordered fold of two values held by a pair: lower (op) higher, whichever this rank holds.
// `mine` is this rank's value and receives the result; `theirs` the peer's (scratch, overwritten).
void fold_in_rank_order(std::byte* mine, std::byte* theirs, bool mine_is_lower, size_t count,
                        const CollectiveContext& ctx);

}  // namespace tinyddp::comm
