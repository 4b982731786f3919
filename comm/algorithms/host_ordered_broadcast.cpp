#include "tinyddp/comm/algorithms/host_ordered_broadcast.h"

#include <algorithm>
#include <vector>

namespace tinyddp::comm {

void host_ordered_broadcast(const HostLayout& layout, const ConnectionLookup& connection_to, int rank, std::byte* buf,
                            size_t bytes, int root, const CollectiveContext& ctx) {
  // The chain: root's host first, from the root on, then the other hosts in turn.
  std::vector<int> order;
  const int root_host = layout.host_of[size_t(root)];
  for (int k = 0; k < layout.hosts(); ++k) {
    const auto& on = layout.ranks_on[size_t((root_host + k) % layout.hosts())];
    order.insert(order.end(), on.begin(), on.end());
  }
  std::rotate(order.begin(),
              std::find(order.begin(), order.begin() + std::ptrdiff_t(layout.ranks_on[size_t(root_host)].size()), root),
              order.begin() + std::ptrdiff_t(layout.ranks_on[size_t(root_host)].size()));
  const int n = int(order.size()), position = int(std::find(order.begin(), order.end(), rank) - order.begin());
  // Only the links the chain uses: a transport may open a connection on first use.
  const Ring chain{position, n, position < n - 1 ? connection_to(order[size_t(position + 1)]) : nullptr,
                   position > 0 ? connection_to(order[size_t(position - 1)]) : nullptr};
  chain_broadcast(chain, buf, bytes, 0, ctx);
}

}  // namespace tinyddp::comm
