#include "tinyddp/comm/algorithms/host_layout.h"

#include <algorithm>
#include <map>

namespace tinyddp::comm {

HostLayout HostLayout::from_host_ids(const std::vector<std::string>& ids) {
  HostLayout layout;
  std::map<std::string, int> index;
  for (int r = 0; r < int(ids.size()); ++r) {
    auto [it, fresh] = index.emplace(ids[size_t(r)], int(layout.ranks_on.size()));
    if (fresh) layout.ranks_on.emplace_back();
    layout.host_of.push_back(it->second);
    layout.ranks_on[size_t(it->second)].push_back(r);
  }
  return layout;
}

HostLayout HostLayout::uniform(int hosts, int per_host) {
  HostLayout layout;
  layout.ranks_on.resize(size_t(hosts));
  for (int r = 0; r < hosts * per_host; ++r) {
    layout.host_of.push_back(r / per_host);
    layout.ranks_on[size_t(r / per_host)].push_back(r);
  }
  return layout;
}

bool HostLayout::is_uniform() const {
  return std::all_of(ranks_on.begin(), ranks_on.end(), [&](const auto& on) { return on.size() == ranks_on[0].size(); });
}

int HostLayout::local_index(int rank) const {
  const auto& on = ranks_on[size_t(host_of[size_t(rank)])];
  return int(std::find(on.begin(), on.end(), rank) - on.begin());
}

}  // namespace tinyddp::comm
