// The α-β-γ cost model of the all-reduce algorithms, and the traffic each one puts on the links.
//
// A collective's time is modelled as
//     T = c  +  Σ_steps m(step)·α(link kind of the step)  +  β_net · (most bytes any host sends to other hosts)
//       + β_host · (most bytes any rank sends inside its host)  +  γ · (most bytes any rank reduces)
// c: the fixed cost of one call, whatever the algorithm: handing the collective to the group's
//    communication thread, waking it, and handing the result back. Every algorithm pays it once, so
//    it never changes which one is fastest (the selector leaves it out: algorithm_selection.cpp), but
//    without it small messages are predicted far faster than they run where those threads share
//    few cores (docs/cluster-network.md).
// α: the fixed cost of one message (its latency and the software around it); a step in which any
//    message crosses hosts pays the network's α, the others the in-host one. m(step): the most
//    messages one rank sends in that step, which it sends one after another: 1 for every algorithm
//    but the direct exchange, whose single step sends n-1 (so it is not mistaken for the cheapest
//    at small sizes on many ranks).
// β: seconds per byte on a link. The network's is per host: the ranks of a host share its link, so
//    what counts is the bytes that leave a host, summed over its ranks (where the hierarchical
//    algorithm saves).
// γ: seconds per byte reduced.
// Bytes of different steps are summed, not overlapped per step: the ring pipelines its steps, and
// for the others the bytes of consecutive steps also go over one link one after the other.
//
// The traffic is counted by walking each algorithm's schedule (who sends how much to whom in which
// step), the same schedule the algorithm files describe, so the model also gives the theoretical
// bytes crossing hosts that bench/compare_cluster.sh checks against the interfaces' counters.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "tinyddp/comm/algorithms/host_layout.h"

namespace tinyddp::comm {

enum class AllReduceAlgorithm { automatic, ring, direct, recursive_doubling, rabenseifner, hierarchical };

// "auto", "ring", "direct", "rd", "rabenseifner", "hier".
const char* algorithm_name(AllReduceAlgorithm algorithm);
// Inverse of algorithm_name; throws naming `where` and listing the names.
AllReduceAlgorithm algorithm_from_name(const std::string& name, const std::string& where);

struct CostModel {
  double alpha_network_s = 30e-6;       // one step that crosses hosts
  double network_bytes_per_s = 1.25e9;  // one host's link (10 Gbit/s)
  double alpha_in_host_s = 5e-6;        // one step inside a host
  double in_host_bytes_per_s = 5e9;     // shared memory, per rank
  double reduce_bytes_per_s = 5e9;      // γ = 1 / this
  double call_s = 2e-6;                 // c: one call's fixed cost (idle cores)

  // "key value" lines, '#' comments: alpha_network_us, network_gbit_per_s, alpha_in_host_us,
  // in_host_gbyte_per_s, reduce_gbyte_per_s, call_us (which may be 0). Keys not given keep their
  // defaults. Throws naming `where` and the line on a bad key or value.
  static CostModel parse(const std::string& text, const std::string& where);
  // TINYDDP_COST_MODEL: "probe", measure the links when a group spanning hosts starts
  // (link_probe.h; it does not measure call_us, which keeps its default); unset or "builtin", the
  // defaults above; anything else, the path of a file parse() reads. The probe is not the default:
  // a measured model may choose another algorithm in the next run (or the next attempt after a
  // restart), and the algorithms add in different orders, so results would differ in the last bits
  // from run to run. A probed model saved as a file gives measured parameters and the same choices
  // every run.
  static bool probe_requested();
  // The defaults above, or the file TINYDDP_COST_MODEL names.
  static CostModel from_environment();
  std::string to_text() const;  // what parse() reads
};

// What one algorithm puts on the links for one all-reduce.
struct Traffic {
  int network_steps = 0;     // dependent steps in which some message crosses hosts
  int in_host_steps = 0;     // the other steps
  int network_messages = 0;  // Σ over those steps of the most messages one rank sends in it
  int in_host_messages = 0;
  std::vector<double> host_egress_bytes;  // by host: bytes its ranks send to other hosts
  std::vector<double> in_host_bytes;      // by rank: bytes it sends to ranks of its own host
  double reduced_bytes = 0;               // the most any rank reduces
  double max_host_egress() const;
  double total_cross_host_bytes() const;
};

// The traffic of `algorithm` (not automatic) for `bytes` per rank on `layout`. The hierarchical
// algorithm's cross-host step is `across`.
Traffic all_reduce_traffic(AllReduceAlgorithm algorithm, const HostLayout& layout, double bytes,
                           AllReduceAlgorithm across = AllReduceAlgorithm::ring);

// The model's T for one call of an algorithm with this traffic: call_s plus transfer_seconds.
double predicted_seconds(const CostModel& model, const Traffic& traffic);
// T without the per-call term: what tells the algorithms apart.
double transfer_seconds(const CostModel& model, const Traffic& traffic);

}  // namespace tinyddp::comm
