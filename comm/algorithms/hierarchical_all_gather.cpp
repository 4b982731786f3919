#include "tinyddp/comm/algorithms/hierarchical_all_gather.h"

#include <cstring>
#include <vector>

#include "tinyddp/comm/algorithms/hierarchical_allreduce.h"
#include "tinyddp/core/error.h"

namespace tinyddp::comm {

bool hierarchical_all_gather_applies(const HostLayout& layout) {
  return layout.hosts() > 1 && layout.per_host() > 1 && layout.is_uniform();
}

void hierarchical_all_gather(const HostLayout& layout, const ConnectionLookup& connection_to, int rank,
                             const std::byte* in, std::byte* out, size_t count, const CollectiveContext& ctx) {
  TINYDDP_CHECK(hierarchical_all_gather_applies(layout), ctx.what(),
                ": the hierarchical all-gather needs several hosts "
                "with the same number (> 1) of ranks each",
                hint("use the flat ring all-gather on this layout"));
  if (count == 0) return;
  const PeerGroup local = host_group(layout, connection_to, rank),
                  across = cross_host_group(layout, connection_to, rank);
  const int L = local.size(), H = across.size();
  const size_t piece = count * dtype_size(ctx.dtype);
  thread_local std::vector<std::byte> by_index, gathered;  // H pieces of one local index; all n, by (index, host)
  by_index.resize(size_t(H) * piece);
  gathered.resize(size_t(H) * size_t(L) * piece);
  ring_all_gather(across.ring(), in, by_index.data(), count, ctx);
  ring_all_gather(local.ring(), by_index.data(), gathered.data(), count * size_t(H), ctx);
  for (int j = 0; j < L; ++j)
    for (int h = 0; h < H; ++h) {
      const int owner = layout.ranks_on[size_t(h)][size_t(j)];
      std::memcpy(out + size_t(owner) * piece, gathered.data() + (size_t(j) * size_t(H) + size_t(h)) * piece, piece);
    }
}

}  // namespace tinyddp::comm
