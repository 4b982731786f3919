#include "comm/small_message_allreduce.h"

#include <cstring>
#include <vector>

namespace tinyddp::comm {

void direct_all_gather(std::span<Connection* const> peers, int rank, const std::byte* in, std::byte* out, size_t bytes,
                       const CollectiveContext& ctx) {
  const int n = int(peers.size());
  std::byte* mine = out + size_t(rank) * bytes;
  if (mine != in && bytes > 0) std::memmove(mine, in, bytes);
  std::vector<Stream> streams;
  streams.reserve(size_t(n));
  for (int p = 0; p < n; ++p) {
    if (p == rank) continue;
    Stream s;
    s.to = s.from = peers[p];
    s.send = {{mine, bytes}};
    s.send_lead = bytes;
    s.recv = {{out + size_t(p) * bytes, nullptr, bytes}};
    streams.push_back(std::move(s));
  }
  // Gathering bytes, not elements: the engine's element granularity must be one byte here.
  CollectiveContext bytewise = ctx;
  bytewise.dtype = DType::u8;
  run_streams(streams, bytewise);
}

void direct_all_reduce(std::span<Connection* const> peers, int rank, const std::byte* in, std::byte* out, size_t count,
                       const CollectiveContext& ctx) {
  const int n = int(peers.size());
  const size_t bytes = count * dtype_size(ctx.dtype);
  std::vector<std::byte> all(size_t(n) * bytes);
  direct_all_gather(peers, rank, in, all.data(), bytes, ctx);
  if (bytes == 0) return;
  // The same fold, in the same order, on every rank.
  std::memcpy(out, all.data(), bytes);
  for (int p = 1; p < n; ++p) reduce_elements(out, out, all.data() + size_t(p) * bytes, count, ctx.dtype, ctx.op);
  if (ctx.op == ReduceOp::avg) finish_average(out, count, ctx.dtype, ctx.world_size);
}

}  // namespace tinyddp::comm
