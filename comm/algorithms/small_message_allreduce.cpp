#include "tinyddp/comm/algorithms/small_message_allreduce.h"

#include <algorithm>
#include <array>
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
      if (p != rank && (sent[p] < bytes || got[p] < bytes))
        waits.push_back({peers[p], sent[p] < bytes, got[p] < bytes});
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

namespace {

// Two ranks: each sends its buffer and folds the peer's into its own straight out of the
// transport, as it arrives (no gathering copy). Both fold in rank order, x0 op x1, as the general
// path does: max and min are not symmetric when a NaN is involved, and both ranks must agree.
// Rank 0 reduces out = own op theirs in place; rank 1 needs theirs op own, which it computes in a
// small aligned scratch and copies out (`reduce_elements` lets the destination alias only its
// first operand).
void pair_all_reduce(Connection* peer, int rank, const std::byte* in, std::byte* out, size_t count,
                     const CollectiveContext& ctx) {
  const size_t elem = dtype_size(ctx.dtype), bytes = count * elem;
  alignas(64) std::array<std::byte, 4096> scratch;
  const size_t scratch_elems = scratch.size() / elem;
  // Folds `n` incoming elements at `theirs` into out[at...].
  auto fold = [&](size_t at, const std::byte* theirs, size_t n) {
    if (rank == 0) return reduce_elements(out + at, in + at, theirs, n, ctx.dtype, ctx.op);
    for (size_t done = 0; done < n;) {
      size_t k = std::min(n - done, scratch_elems);
      std::memcpy(scratch.data(), theirs + done * elem, k * elem);
      reduce_elements(scratch.data(), scratch.data(), in + at + done * elem, k, ctx.dtype, ctx.op);
      std::memcpy(out + at + done * elem, scratch.data(), k * elem);
      done += k;
    }
  };
  ElementReader reader;
  size_t sent = 0, folded = 0;
  CollectiveWaiter waiter(ctx);
  thread_local std::vector<WaitFor> waits;
  for (;;) {
    bool moved = false;
    if (sent < bytes) {
      size_t k = peer->try_send(in + sent, bytes - sent, elem);
      sent += k;
      moved |= k > 0;
    }
    // In place, an element is overwritten only once it has been sent (the transport takes a small
    // message at once unless the peer is far behind).
    const size_t limit = out == in ? sent : bytes;
    while (folded < limit) {
      size_t n = reader.take(*peer, limit - folded, elem,
                             [&](const std::byte* theirs, size_t k) { fold(folded, theirs, k); });
      if (n == 0) break;
      folded += n;
      moved = true;
    }
    if (sent == bytes && folded == bytes) break;
    if (moved) {
      waiter.progressed();
      continue;
    }
    waits.assign({{peer, sent < bytes, folded < bytes}});
    waiter.wait(waits);
  }
  if (ctx.op == ReduceOp::avg) finish_average(out, count, ctx.dtype, ctx.world_size);
}

}  // namespace

void direct_all_reduce(std::span<Connection* const> peers, int rank, const std::byte* in, std::byte* out, size_t count,
                       const CollectiveContext& ctx) {
  const int n = int(peers.size());
  const size_t bytes = count * dtype_size(ctx.dtype);
  if (bytes == 0) return;
  // Two ranks over shared memory fold in place. Over tcp, where two ranks use this path up to
  // 512 KiB, the fold lost to the gathering exchange below at 64 KiB
  // (docs/results.md#small-message-algorithm-or-ring-the-crossover).
  if (n == 2 && std::strcmp(peers[size_t(1 - rank)]->transport().name(), "shm") == 0)
    return pair_all_reduce(peers[size_t(1 - rank)], rank, in, out, count, ctx);
  // The gathered inputs: a buffer of the thread's own, reused, for the sizes this path is meant for
  // (no allocation per call); a one-off for anything larger (TINYDDP_SMALL_MESSAGE_BYTES raised).
  thread_local std::vector<std::byte> kept;
  std::vector<std::byte> one_off;
  std::vector<std::byte>& all = size_t(n) * bytes <= tuning::kDirectExchangeKeptBytes ? kept : one_off;
  if (all.size() < size_t(n) * bytes) all.resize(size_t(n) * bytes);
  direct_all_gather(peers, rank, in, all.data(), bytes, ctx);
  // The same fold, in the same order, on every rank.
  std::memcpy(out, all.data(), bytes);
  for (int p = 1; p < n; ++p) reduce_elements(out, out, all.data() + size_t(p) * bytes, count, ctx.dtype, ctx.op);
  if (ctx.op == ReduceOp::avg) finish_average(out, count, ctx.dtype, ctx.world_size);
}

}  // namespace tinyddp::comm
