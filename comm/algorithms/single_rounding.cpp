#include "tinyddp/comm/algorithms/single_rounding.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "tinyddp/core/error.h"
#include "tinyddp/core/half_convert.h"

namespace tinyddp::comm {

namespace {

// Step 1: `received` (n slots of this rank's chunk) gets slot p = rank p's copy of chunk `rank`.
// Every peer is one stream of the engine: chunk p of `in` goes out to p while p's copy of ours comes in.
void all_to_all_chunks(std::span<Connection* const> peers, int rank, const std::byte* in, size_t count,
                       std::byte* received, const CollectiveContext& ctx) {
  const int n = int(peers.size());
  const size_t elem = dtype_size(ctx.dtype), mine = chunk_count(count, n, rank) * elem;
  if (mine > 0) std::memcpy(received + size_t(rank) * mine, in + chunk_begin(count, n, rank) * elem, mine);
  std::vector<Stream> streams;
  for (int p = 0; p < n; ++p) {
    if (p == rank) continue;
    Stream s;
    s.to = s.from = peers[size_t(p)];
    const size_t theirs = chunk_count(count, n, p) * elem;
    s.send.push_back({in + chunk_begin(count, n, p) * elem, theirs});
    s.send_lead = theirs;  // nothing to wait for: these are this rank's own values
    s.recv.push_back({received + size_t(p) * mine, nullptr, mine});
    streams.push_back(std::move(s));
  }
  run_streams(streams, ctx);
}

// Step 2: out = the n slots of `received` summed in f32 in rank order, rounded once (avg: divided
// by n in f32 first). A block at a time through the vector conversions of this CPU.
template <typename Half>
void sum_in_rank_order(const Half* received, size_t per_slot, int n, bool average, Half* out) {
  constexpr size_t kBlock = 1024;
  alignas(64) float sum[kBlock], term[kBlock];
  for (size_t done = 0; done < per_slot; done += kBlock) {
    const size_t k = std::min(kBlock, per_slot - done);
    widen_to_f32(received + done, sum, k);
    for (int p = 1; p < n; ++p) {
      widen_to_f32(received + size_t(p) * per_slot + done, term, k);
      for (size_t i = 0; i < k; ++i) sum[i] += term[i];
    }
    if (average)
      for (size_t i = 0; i < k; ++i) sum[i] /= float(n);
    round_from_f32(sum, out + done, k);
  }
}

}  // namespace

bool single_rounding_supports(DType dtype, ReduceOp op) {
  return (dtype == DType::bf16 || dtype == DType::f16) && (op == ReduceOp::sum || op == ReduceOp::avg);
}

void single_rounding_reduce_scatter(std::span<Connection* const> peers, int rank, const std::byte* in, std::byte* out,
                                    size_t count, const CollectiveContext& ctx) {
  TINYDDP_CHECK(single_rounding_supports(ctx.dtype, ctx.op), ctx.what(), ": single-rounding reductions take bf16 or ",
                "f16 with sum or avg, not ", dtype_name(ctx.dtype), " with ", reduce_op_name(ctx.op),
                hint("use all_reduce / reduce_scatter for other dtypes and ops"));
  const int n = int(peers.size());
  const size_t per_slot = chunk_count(count, n, rank);
  std::vector<std::byte> received(size_t(n) * per_slot * dtype_size(ctx.dtype));
  all_to_all_chunks(peers, rank, in, count, received.data(), ctx);
  const bool average = ctx.op == ReduceOp::avg;
  if (ctx.dtype == DType::bf16)
    sum_in_rank_order(reinterpret_cast<const bfloat16*>(received.data()), per_slot, n, average,
                      reinterpret_cast<bfloat16*>(out));
  else
    sum_in_rank_order(reinterpret_cast<const float16*>(received.data()), per_slot, n, average,
                      reinterpret_cast<float16*>(out));
}

void single_rounding_all_reduce(std::span<Connection* const> peers, const Ring& ring, const std::byte* in,
                                std::byte* out, size_t count, const CollectiveContext& ctx) {
  const size_t elem = dtype_size(ctx.dtype);
  std::byte* my_chunk = out + chunk_begin(count, ring.size, ring.rank) * elem;
  // `in` is read only during the all-to-all, so the rounded chunk may land in it when out == in.
  single_rounding_reduce_scatter(peers, ring.rank, in, my_chunk, count, ctx);
  if (ring.size > 1) ring_all_gather_chunks(ring, out, count, ctx);  // step 3
}

}  // namespace tinyddp::comm
