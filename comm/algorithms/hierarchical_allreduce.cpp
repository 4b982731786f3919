#include "tinyddp/comm/algorithms/hierarchical_allreduce.h"

#include <cstring>
#include <vector>

#include "tinyddp/core/error.h"

namespace tinyddp::comm {

PeerGroup host_group(const HostLayout& layout, const ConnectionLookup& connection_to, int rank) {
  return PeerGroup{layout.local_index(rank), layout.ranks_on[size_t(layout.host_of[size_t(rank)])], connection_to};
}

PeerGroup cross_host_group(const HostLayout& layout, const ConnectionLookup& connection_to, int rank) {
  PeerGroup group{layout.host_of[size_t(rank)], {}, connection_to};
  const int j = layout.local_index(rank);
  for (const auto& on : layout.ranks_on) group.members.push_back(on[size_t(j)]);
  return group;
}

void hierarchical_all_reduce(const HostLayout& layout, const ConnectionLookup& connection_to, int rank,
                             const std::byte* in, std::byte* out, size_t count, GroupAllReduce across_hosts,
                             const CollectiveContext& ctx) {
  TINYDDP_CHECK(layout.is_uniform(), ctx.what(),
                ": the hierarchical all-reduce needs the same number of ranks on every "
                "host, but host 0 has ",
                layout.per_host(), " and another has a different count",
                hint("launch the same "
                     "number of ranks per host, or use TINYDDP_ALGO=auto (which picks a flat algorithm here)"));
  const PeerGroup local = host_group(layout, connection_to, rank),
                  across = cross_host_group(layout, connection_to, rank);
  const int L = local.size(), H = across.size();
  const size_t elem = dtype_size(ctx.dtype);
  if (L == 1) return across_hosts(across, in, out, count, ctx);
  if (H == 1) return ring_all_reduce(local.ring(), in, out, count, ctx);
  if (count == 0) return;
  // The parts are summed; an average divides once, at the end of step 2.
  CollectiveContext summing = ctx;
  if (ctx.op == ReduceOp::avg) summing.op = ReduceOp::sum;
  const size_t part = (count + size_t(L) - 1) / size_t(L), padded = part * size_t(L);
  thread_local std::vector<std::byte> padded_buffer, my_part;
  const std::byte* src = in;
  std::byte* dst = out;
  if (padded != count) {
    padded_buffer.assign(padded * elem, std::byte{0});
    std::memcpy(padded_buffer.data(), in, count * elem);
    src = dst = padded_buffer.data();
  }
  if (my_part.size() < part * elem) my_part.resize(part * elem);
  ring_reduce_scatter(local.ring(), src, my_part.data(), part, summing);
  across_hosts(across, my_part.data(), my_part.data(), part, summing);
  if (ctx.op == ReduceOp::avg) finish_average(my_part.data(), part, ctx.dtype, ctx.world_size);
  ring_all_gather(local.ring(), my_part.data(), dst, part, summing);
  if (dst != out) std::memcpy(out, dst, count * elem);
}

}  // namespace tinyddp::comm
