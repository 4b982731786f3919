// RingBackend: the hand-written ProcessGroup ("ring").
//
// Setup: every rank publishes its host identity in the store; ranks that share a host talk
// through ShmTransport, the others through TcpTransport (options.transport forces one of them).
//
// Execution: collectives are queued and run, in call order, by one communication thread per
// group, which drives the transports with the algorithms of ring_algorithms.h (large messages)
// and small_message_allreduce.h (small ones). A caller that waits on a collective nobody has
// started yet runs the queue itself (see Work), so a synchronous caller pays no thread hand-off.
//
// CUDA tensors are staged: copied to pinned host memory, reduced on the CPU, copied back.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/algorithms/ring_algorithms.h"
#include "comm/debug_check.h"
#include "comm/process_group.h"

namespace tinyddp::comm {

class ShmTransport;
class TcpTransport;

class RingBackend : public ProcessGroup {
 public:
  RingBackend(std::shared_ptr<Store> store, int rank, int size, const ProcessGroupOptions& options);
  ~RingBackend() override;  // runs what is still queued, then closes the transports

  std::string backend() const override { return "ring"; }
  WorkPtr all_reduce(const Tensor& tensor, ReduceOp op = ReduceOp::sum, const CallOptions& call = {}) override;
  WorkPtr all_reduce_into(const Tensor& output, const Tensor& input, ReduceOp op = ReduceOp::sum,
                          const CallOptions& call = {}) override;
  WorkPtr all_reduce_coalesced(const std::vector<Tensor>& tensors, ReduceOp op = ReduceOp::sum,
                               const CallOptions& call = {}) override;
  WorkPtr broadcast(const Tensor& tensor, int root = 0, const CallOptions& call = {}) override;
  WorkPtr all_gather(const Tensor& output, const Tensor& input, const CallOptions& call = {}) override;
  WorkPtr reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op = ReduceOp::sum,
                         const CallOptions& call = {}) override;
  WorkPtr barrier(const CallOptions& call = {}) override;

  // Which transport reaches `peer`: "shm" or "tcp" ("self" for this rank).
  std::string transport_to(int peer) const;
  size_t small_message_bytes() const { return small_message_bytes_; }
  // How many collectives ran on the communication thread, and how many on a waiting caller's
  // thread (see Executor in the .cpp: a blocking caller runs its small collectives itself).
  struct RunCounts {
    uint64_t by_thread = 0;
    uint64_t by_caller = 0;
  };
  RunCounts collectives_run() const;

  class Executor;

 private:
  // What a collective does once it runs, given the call's context (name, deadline, ...).
  using Body = std::function<void(const CollectiveContext&)>;
  // Queues `body` as the next collective.
  WorkPtr enqueue(Fingerprint fingerprint, const CallOptions& call, Body body);
  void run_task(const Fingerprint& fingerprint, std::chrono::milliseconds timeout, const Body& body, Work& work);
  void check_fingerprints(const Fingerprint& mine, const CollectiveContext& ctx);
  void all_reduce_bytes(const std::byte* in, std::byte* out, size_t count, const CollectiveContext& ctx);
  Ring ring() const;

  std::shared_ptr<Store> store_;
  ProcessGroupOptions options_;
  bool debug_detail_;
  size_t small_message_bytes_;
  std::unique_ptr<ShmTransport> shm_;
  std::unique_ptr<TcpTransport> tcp_;
  std::vector<Connection*> peers_;  // by rank; nullptr at this rank
  std::vector<Transport*> transports_;
  uint64_t next_sequence_ = 0;      // the next collective's number (under enqueue_mutex_)
  std::mutex enqueue_mutex_;
  std::string aborted_;             // the first failure's message, once the group is aborted
  std::shared_ptr<Executor> executor_;
};

}  // namespace tinyddp::comm
