#include "comm/small_message_allreduce.h"

#include <cstring>
#include <vector>

namespace tinyddp::comm {

namespace {

// Sends `bytes` of `mine` to every peer and receives each peer's `bytes` into out[p * bytes], all
// at once. A plain loop over the peers rather than the stream engine: a small collective is all
// fixed cost, and this path makes no allocation per call (the vectors are the thread's, reused).
void exchange(std::span<Connection* const> peers, int rank, const std::byte* mine, std::byte* out, size_t bytes,
              const CollectiveContext& ctx) {
  const int n = int(peers.size());
  thread_local std::vector<size_t> sent, got;
  thread_local std::vector<WaitFor> waits;
  sent.assign(size_t(n), 0);
  got.assign(size_t(n), 0);
  CollectiveWaiter waiter(ctx);
  for (;;) {
    bool moved = false, done = true;
    for (int p = 0; p < n; ++p) {
      if (p == rank) continue;
      Connection* c = peers[p];
      if (sent[p] < bytes) {
        size_t k = c->try_send(mine + sent[p], bytes - sent[p], 1);
        sent[p] += k;
        moved |= k > 0;
      }
      if (got[p] < bytes) {
        size_t k = c->try_recv(out + size_t(p) * bytes + got[p], bytes - got[p]);
        got[p] += k;
        moved |= k > 0;
      }
      done &= sent[p] == bytes && got[p] == bytes;
    }
    if (done) return;
    if (moved) {
      waiter.progressed();
      continue;
    }
    waits.clear();
    for (int p = 0; p < n; ++p)
      if (p != rank && (sent[p] < bytes || got[p] < bytes)) waits.push_back({peers[p], sent[p] < bytes, got[p] < bytes});
    waiter.wait(waits);
  }
}

}  // namespace

void direct_all_gather(std::span<Connection* const> peers, int rank, const std::byte* in, std::byte* out, size_t bytes,
                       const CollectiveContext& ctx) {
  std::byte* mine = out + size_t(rank) * bytes;
  if (mine != in && bytes > 0) std::memmove(mine, in, bytes);
  if (bytes > 0) exchange(peers, rank, mine, out, bytes, ctx);
}

void direct_all_reduce(std::span<Connection* const> peers, int rank, const std::byte* in, std::byte* out, size_t count,
                       const CollectiveContext& ctx) {
  const int n = int(peers.size());
  const size_t bytes = count * dtype_size(ctx.dtype);
  if (bytes == 0) return;
  // The gathered inputs: a buffer of the thread's own, reused, for the sizes this path is meant for
  // (no allocation per call); a one-off for anything larger (TINYDDP_SMALL_MESSAGE_BYTES raised).
  constexpr size_t kKeptBytes = 4 << 20;  // 2 ranks x 2 MiB: the largest direct exchange by default (tcp)
  thread_local std::vector<std::byte> kept;
  std::vector<std::byte> one_off;
  std::vector<std::byte>& all = size_t(n) * bytes <= kKeptBytes ? kept : one_off;
  if (all.size() < size_t(n) * bytes) all.resize(size_t(n) * bytes);
  direct_all_gather(peers, rank, in, all.data(), bytes, ctx);
  // The same fold, in the same order, on every rank.
  std::memcpy(out, all.data(), bytes);
  for (int p = 1; p < n; ++p) reduce_elements(out, out, all.data() + size_t(p) * bytes, count, ctx.dtype, ctx.op);
  if (ctx.op == ReduceOp::avg) finish_average(out, count, ctx.dtype, ctx.world_size);
}

}  // namespace tinyddp::comm
