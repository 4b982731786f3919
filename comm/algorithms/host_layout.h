// HostLayout: which ranks share a host. The hierarchical algorithm runs along it, and the cost
// model (algorithm_selection.h) counts which bytes cross hosts with it.
#pragma once

#include <string>
#include <vector>

namespace tinyddp::comm {

struct HostLayout {
  std::vector<int> host_of;                // by rank: its host's index (hosts numbered by their lowest rank)
  std::vector<std::vector<int>> ranks_on;  // by host: its ranks, in rank order

  // From every rank's host identity (equal strings: one host).
  static HostLayout from_host_ids(const std::vector<std::string>& ids);
  // `hosts` hosts of `per_host` ranks each, host-major (ranks h·L .. h·L+L-1 on host h), as
  // launchers place them.
  static HostLayout uniform(int hosts, int per_host);

  int world() const { return int(host_of.size()); }
  int hosts() const { return int(ranks_on.size()); }
  // Every host has the same number of ranks (the hierarchical algorithm needs it).
  bool is_uniform() const;
  // Ranks per host when uniform.
  int per_host() const { return ranks_on.empty() ? 0 : int(ranks_on[0].size()); }
  // The rank's index among the ranks of its host.
  int local_index(int rank) const;
};

}  // namespace tinyddp::comm
