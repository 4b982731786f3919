// Link probe: the cost model's parameters (cost_model.h), measured when a process group starts
// (TINYDDP_COST_MODEL=probe).
//
// A model told "10 Gbit/s" picks algorithms for a link the CPUs may not be able to fill: what a
// collective gets is what the link and the cores that drive it deliver together. So the probe
// measures the links as the collectives use them, every rank taking part at once:
//   - across hosts: each rank exchanges with the rank of the same local index on its partner host
//     (hosts paired 0-1, 2-3, ...; an odd last host sits this phase out): every host's link carries
//     all its ranks' bytes at once, and every core drives a connection, as in a collective;
//   - inside a host: each rank exchanges with its neighbour by local index (0-1, 2-3, ...) over
//     shared memory, on every host at once;
//   - the reduction: each rank folds a buffer into another, all at once.
// Each link phase measures
//   α: the median time of one exchange of a few bytes (a dependent step: a message there and back
//      in both directions);
//   β: large exchanges, timed after one untimed round (which also drains a shaping token bucket's
//      burst, as a long collective would). Inside a host: per rank, their average less α. Across
//      hosts the rate is per host, as the model counts it: the bytes all the host's ranks sent in
//      the timed rounds, over the span from the first one's start to the last one's end (one host's
//      clock), less α per round; so it holds whether or not the host's ranks sent at the same moment.
// Every rank publishes what it measured under `key`/probe/<rank>; rank 0 takes, per parameter, the
// median over the ranks (or hosts) that measured it (one rank descheduled at a bad moment must not
// set the model of the whole job) and publishes the model every rank then uses (agree_on_model).
// A parameter nobody could measure (no second host, no second rank on a host) keeps `defaults`'.
//
// Cost: 4 large and 16 small exchanges per link kind plus 3 reductions of kProbeBytes; at 1 Gbit/s
// with 2 ranks per host the network phase dominates (about 6 MiB through each host's link).
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "tinyddp/comm/algorithms/cost_model.h"
#include "tinyddp/comm/algorithms/host_layout.h"
#include "tinyddp/comm/algorithms/peer_group.h"

namespace tinyddp::comm {

class Store;

// Bytes of one large probe exchange (and of one probe reduction), and how many are timed.
inline constexpr size_t kProbeBytes = size_t(2) << 20;
inline constexpr int kProbeRounds = 3;

// What one rank measured; 0 where it took no part.
struct LinkMeasurement {
  double alpha_network_s = 0;
  // Each timed large exchange's start and end, in seconds of the host's steady clock.
  std::array<double, kProbeRounds> network_begin{}, network_end{};
  double alpha_in_host_s = 0, in_host_bytes_per_s = 0;
  double reduce_bytes_per_s = 0;
  std::string to_text() const;
  static LinkMeasurement parse(const std::string& text, const std::string& where);
};

// This rank's part of the probe (see the top); ctx gives the deadline, waiting and transports.
// `line_up` returns once every rank has called it (a barrier): it starts the ranks' network phase
// together, so that the hosts' links carry all their ranks' bytes at once.
LinkMeasurement measure_links(const HostLayout& layout, const ConnectionLookup& connection_to, int rank,
                              const CollectiveContext& ctx, const std::function<void()>& line_up);

// Per parameter, the median over the ranks (network rate: hosts) that measured it; `defaults`
// where none did. `measured` is by rank.
CostModel model_from_measurements(const std::vector<LinkMeasurement>& measured, const HostLayout& layout,
                                  const CostModel& defaults);

// measure_links on every rank, then the model rank 0 builds from all of them, the same on every
// rank. Every rank of the group must call it at the same point.
CostModel probe_cost_model(Store& store, const std::string& key, const HostLayout& layout,
                           const ConnectionLookup& connection_to, int rank, const CollectiveContext& ctx,
                           const CostModel& defaults);

}  // namespace tinyddp::comm
