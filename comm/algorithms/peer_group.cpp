#include "tinyddp/comm/algorithms/peer_group.h"

#include <bit>
#include <cstring>

namespace tinyddp::comm {

Ring PeerGroup::ring() const {
  const int n = size();
  return Ring{rank, n, peer((rank + 1) % n), peer((rank + n - 1) % n)};
}

void ring_group_all_reduce(const PeerGroup& group, const std::byte* in, std::byte* out, size_t count,
                           const CollectiveContext& ctx) {
  ring_all_reduce(group.ring(), in, out, count, ctx);
}

PowerOfTwoCore::PowerOfTwoCore(int n) : size(int(std::bit_floor(unsigned(n)))), extra(n - size) {}

int PowerOfTwoCore::core_rank(int r) const {
  if (r < 2 * extra) return r % 2 == 0 ? -1 : r / 2;
  return r - extra;
}

int PowerOfTwoCore::group_rank(int c) const { return c < extra ? 2 * c + 1 : c + extra; }

namespace {

// One stream each way with `peer`: send everything at once; receive into dst, folding it into `own`
// when `own` is set (dst = own (op) incoming), copying it otherwise.
void exchange_stream(Connection* peer, const std::byte* send, size_t send_bytes, std::byte* dst, const std::byte* own,
                     size_t recv_bytes, const CollectiveContext& ctx) {
  Stream s;
  s.to = peer;
  s.send.push_back({send, send_bytes});
  s.send_lead = send_bytes;
  s.from = peer;
  s.recv.push_back({dst, own, recv_bytes});
  run_streams({&s, 1}, ctx);
}

}  // namespace

void exchange(Connection* peer, const std::byte* send, size_t send_bytes, std::byte* recv, size_t recv_bytes,
              const CollectiveContext& ctx) {
  exchange_stream(peer, send, send_bytes, recv, nullptr, recv_bytes, ctx);
}

void exchange_and_fold(Connection* peer, const std::byte* send, size_t send_bytes, std::byte* dst, size_t fold_bytes,
                       const CollectiveContext& ctx) {
  exchange_stream(peer, send, send_bytes, dst, dst, fold_bytes, ctx);
}

void fold_in_rank_order(std::byte* mine, std::byte* theirs, bool mine_is_lower, size_t count,
                        const CollectiveContext& ctx) {
  // reduce_elements lets the destination alias only its first operand.
  if (mine_is_lower) {
    reduce_elements(mine, mine, theirs, count, ctx.dtype, ctx.op);
  } else {
    reduce_elements(theirs, theirs, mine, count, ctx.dtype, ctx.op);
    std::memcpy(mine, theirs, count * dtype_size(ctx.dtype));
  }
}

void fold_into_core(const PeerGroup& group, const PowerOfTwoCore& core, std::byte* buf, size_t count, bool lower_first,
                    const CollectiveContext& ctx) {
  const int r = group.rank;
  if (r >= 2 * core.extra) return;
  const size_t bytes = count * dtype_size(ctx.dtype);
  if (r % 2 == 0) return exchange(group.peer(r + 1), buf, bytes, nullptr, 0, ctx);
  if (!lower_first) return exchange_and_fold(group.peer(r - 1), nullptr, 0, buf, bytes, ctx);
  thread_local std::vector<std::byte> theirs;
  if (theirs.size() < bytes) theirs.resize(bytes);
  exchange(group.peer(r - 1), nullptr, 0, theirs.data(), bytes, ctx);
  fold_in_rank_order(buf, theirs.data(), false, count, ctx);
}

void unfold_from_core(const PeerGroup& group, const PowerOfTwoCore& core, std::byte* buf, size_t count,
                      const CollectiveContext& ctx) {
  const int r = group.rank;
  if (r >= 2 * core.extra) return;
  const size_t bytes = count * dtype_size(ctx.dtype);
  if (r % 2 == 0)
    exchange(group.peer(r + 1), nullptr, 0, buf, bytes, ctx);
  else
    exchange(group.peer(r - 1), buf, bytes, nullptr, 0, ctx);
}

}  // namespace tinyddp::comm
