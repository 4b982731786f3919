#include "tinyddp/comm/algorithms/ring.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace tinyddp::comm {

namespace {

int wrap(int i, int n) { return ((i % n) + n) % n; }

// The all-gather half of a ring over `buf`, `count` elements cut into chunks (chunk_begin): this rank
// starts with chunk `owned` and at each step sends on the chunk it received the step before, so after
// n - 1 steps every chunk is on every rank.
void add_all_gather_regions(Stream& s, const Ring& ring, std::byte* buf, size_t count, size_t elem, int owned) {
  const int n = ring.size;
  for (int step = 0; step < n - 1; ++step) {
    const int send_chunk = wrap(owned - step, n), recv_chunk = wrap(owned - step - 1, n);
    s.send.push_back({buf + chunk_begin(count, n, send_chunk) * elem, chunk_count(count, n, send_chunk) * elem});
    s.recv.push_back(
        {buf + chunk_begin(count, n, recv_chunk) * elem, nullptr, chunk_count(count, n, recv_chunk) * elem});
  }
}

}  // namespace

void ring_all_reduce(const Ring& ring, const std::byte* in, std::byte* out, size_t count,
                     const CollectiveContext& ctx) {
  const int n = ring.size, r = ring.rank;
  const size_t elem = dtype_size(ctx.dtype);
  auto offset = [&](int chunk) { return chunk_begin(count, n, chunk) * elem; };
  auto bytes = [&](int chunk) { return chunk_count(count, n, chunk) * elem; };
  Stream s;
  s.to = ring.next;
  s.from = ring.prev;
  s.send_lead = bytes(r);
  for (int step = 0; step < n - 1; ++step) {  // reduce-scatter
    int send_chunk = wrap(r - step, n), recv_chunk = wrap(r - step - 1, n);
    s.send.push_back({(step == 0 ? in : out) + offset(send_chunk), bytes(send_chunk)});
    s.recv.push_back({out + offset(recv_chunk), in + offset(recv_chunk), bytes(recv_chunk),
                      ctx.op == ReduceOp::avg && step == n - 2});
  }
  add_all_gather_regions(s, ring, out, count, elem, wrap(r + 1, n));  // the chunk this rank finished
  run_streams({&s, 1}, ctx);
}

void ring_all_gather_chunks(const Ring& ring, std::byte* buf, size_t count, const CollectiveContext& ctx) {
  const size_t elem = dtype_size(ctx.dtype);
  Stream s;
  s.to = ring.next;
  s.from = ring.prev;
  s.send_lead = chunk_count(count, ring.size, ring.rank) * elem;
  add_all_gather_regions(s, ring, buf, count, elem, ring.rank);
  run_streams({&s, 1}, ctx);
}

void ring_reduce_scatter(const Ring& ring, const std::byte* in, std::byte* out, size_t count_per_rank,
                         const CollectiveContext& ctx) {
  const int n = ring.size, r = ring.rank;
  const size_t chunk = count_per_rank * dtype_size(ctx.dtype);
  // Partial sums travel through a scratch area: the input is the caller's and stays untouched.
  std::vector<std::byte> scratch(size_t(std::max(0, n - 2)) * chunk);
  Stream s;
  s.to = ring.next;
  s.from = ring.prev;
  s.send_lead = chunk;
  s.send.push_back({in + size_t(wrap(r - 1, n)) * chunk, chunk});
  for (int step = 0; step < n - 1; ++step) {
    int recv_chunk = wrap(r - 2 - step, n);
    bool last = step == n - 2;  // the last chunk received is chunk r, the one this rank keeps
    std::byte* dst = last ? out : scratch.data() + size_t(step) * chunk;
    s.recv.push_back({dst, in + size_t(recv_chunk) * chunk, chunk, ctx.op == ReduceOp::avg && last});
    if (!last) s.send.push_back({dst, chunk});
  }
  run_streams({&s, 1}, ctx);
}

void ring_all_gather(const Ring& ring, const std::byte* in, std::byte* out, size_t count_per_rank,
                     const CollectiveContext& ctx) {
  const int n = ring.size, r = ring.rank;
  const size_t chunk = count_per_rank * dtype_size(ctx.dtype);
  std::byte* mine = out + size_t(r) * chunk;
  if (in != mine && chunk > 0) std::memmove(mine, in, chunk);
  Stream s;
  s.to = ring.next;
  s.from = ring.prev;
  s.send_lead = chunk;
  s.send.push_back({mine, chunk});
  for (int step = 0; step < n - 1; ++step) {
    std::byte* dst = out + size_t(wrap(r - 1 - step, n)) * chunk;
    s.recv.push_back({dst, nullptr, chunk});
    if (step < n - 2) s.send.push_back({dst, chunk});
  }
  run_streams({&s, 1}, ctx);
}

void chain_broadcast(const Ring& ring, std::byte* buf, size_t bytes, int root, const CollectiveContext& ctx) {
  const int n = ring.size;
  const int position = wrap(ring.rank - root, n);  // 0 = root, n-1 = the end of the chain
  Stream s;
  if (position < n - 1) {
    s.to = ring.next;
    s.send.push_back({buf, bytes});
    s.send_lead = position == 0 ? bytes : 0;  // the others forward what they have received
  }
  if (position > 0) {
    s.from = ring.prev;
    s.recv.push_back({buf, nullptr, bytes});
  }
  run_streams({&s, 1}, ctx);
}

}  // namespace tinyddp::comm
