// PerfJob: the ranks of one benchmark run, met and joined in a process group, and what they know
// about each other (hosts, devices, the transport the group actually uses).
//
// Under a launcher (tinyddp-run, torchrun, srun, mpirun: env://) or with --init-method tcp://, the
// ranks rendezvous; started alone, the program is a world of one. The small exchanges a benchmark
// needs besides the collective it times (per-rank times, #wrong, a refusal to start) go through
// the same group, on the group's device (NCCL moves CUDA tensors only).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tinyddp/comm/process_group.h"
#include "tinyddp/comm/store/rendezvous.h"
#include "tinyddp/core/device.h"

namespace tinyddp::bench {

struct PerfOptions;
class PerfCollective;

// One rank, as nccl-tests' "#  Rank  0 Group  0 Pid ... on host device 0 [...] name" line says it.
struct RankInfo {
  int rank = 0;
  int pid = 0;
  std::string hostname;
  int device = -1;          // the CUDA ordinal; -1 for the CPU
  std::string device_hex;   // "cpu" or "cuda:N" (nccl-tests prints the PCI address here)
  std::string device_info;  // the CPU model, or "CUDA device"
  std::string transports;   // the transports this rank's group uses to reach the others ("shm", "tcp+shm", ...)
};

class PerfJob {
 public:
  // Meets the other ranks and creates the group the options ask for.
  static PerfJob start(const PerfOptions& options, const PerfCollective& collective);

  int rank() const { return rank_; }
  int world() const { return world_; }
  Device device() const { return device_; }
  comm::ProcessGroup& group() { return *group_; }
  const std::vector<RankInfo>& ranks() const { return ranks_; }
  // The transports the group uses between its ranks, over all of them: "shm", "tcp", "shm+tcp",
  // "nccl", or "none" for a world of one.
  const std::string& transport() const { return transport_; }
  // How many ranks share this rank's host (they share its memory).
  int ranks_on_this_host() const;
  // The lowest rank on this rank's host.
  bool first_on_this_host() const;

  // Every rank's `mine` (each the same length), in rank order.
  std::vector<double> all_gather(const std::vector<double>& mine);
  int64_t sum(int64_t mine);
  int64_t max(int64_t mine);
  void barrier();
  // Tells the launcher that this rank failed with `message` (torchrun's error file; a no-op elsewhere).
  void report_failure(const std::string& message);

 private:
  comm::Rendezvous rendezvous_;  // keeps the store (and on rank 0 its server) alive
  std::shared_ptr<comm::ProcessGroup> group_;
  int rank_ = 0, world_ = 1;
  Device device_;
  std::vector<RankInfo> ranks_;
  std::string transport_;
};

}  // namespace tinyddp::bench
