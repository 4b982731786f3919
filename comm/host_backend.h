// HostBackend: the hand-written ProcessGroup ("host").
//
// A collective's way through it, in the order the .cpp reads:
//   collectives  all_reduce, broadcast, ...: check the arguments in the caller's thread, describe
//                the call (its fingerprint) and what it will do once it runs (its body);
//   task         the call becomes a task of the group's Executor (executor.h), which runs the tasks
//                one at a time, in call order, on the communication thread or on a caller that
//                waits; run_task gives each body its context (deadline, transports, wait policy);
//   algorithm    the body stages CUDA tensors through pinned host memory and runs the algorithm:
//                ring.h for large messages, small_message_allreduce.h for small ones;
//                all-reduce asks algorithms/algorithm_selection.h, which also knows recursive
//                doubling, Rabenseifner and the hierarchical algorithm for ranks on several hosts.
//
// Setup: every rank publishes its host identity in the store; ranks that share a host talk through
// ShmTransport, the others through TcpTransport (options.transport forces one of them). The group
// also decides how its threads wait (WaitPolicy: is the host oversubscribed?) and which core its
// communication thread runs on (cpu_binding.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "tinyddp/comm/algorithms/ring.h"
#include "tinyddp/comm/collective_watchdog.h"
#include "tinyddp/comm/executor.h"
#include "tinyddp/comm/flight_recorder.h"
#include "tinyddp/comm/process_group.h"
#include "tinyddp/comm/symmetric/symmetric_memory.h"
#include "tinyddp/comm/wait_policy.h"
#include "tinyddp/core/function_ref.h"

namespace tinyddp::comm {

class AllReduceSelector;
struct CostModel;
struct HostLayout;
class ShmTransport;
class SymmetricBuffer;
class TcpTransport;

class HostBackend : public ProcessGroup {
 public:
  HostBackend(std::shared_ptr<Store> store, int rank, int size, const ProcessGroupOptions& options);
  ~HostBackend() override;  // runs what is still queued, then closes the transports

  std::string backend() const override { return "host"; }
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
  WorkPtr all_reduce_single_rounding(const Tensor& tensor, ReduceOp op = ReduceOp::sum,
                                     const CallOptions& call = {}) override;
  WorkPtr reduce_scatter_single_rounding(const Tensor& output, const Tensor& input, ReduceOp op = ReduceOp::sum,
                                         const CallOptions& call = {}) override;
  Tensor allocate_symmetric(const Shape& shape, DType dtype = DType::f32) override;
  bool is_symmetric(const Tensor& t) const override;
  CollectiveTime time_in_collectives() const override {
    auto t = recorder_->totals();
    return {t.collectives, t.seconds};
  }

  // Which transport reaches `peer`: "shm" or "tcp" ("self" for this rank).
  std::string transport_to(int peer) const;
  size_t small_message_bytes() const { return small_message_bytes_; }
  const WaitPolicy& wait_policy() const { return wait_; }
  // Whether a rank of this host may run on one of this rank's CPUs (the ranks publish their affinity
  // masks when the group is made): a caller running its own collective yields the core between its
  // looks at the peers only then.
  bool shares_cpus_with_peers() const { return shares_cpus_with_peers_; }
  // How many collectives ran on the communication thread, and how many on a waiting caller's
  // thread (a blocking caller runs its small collectives itself; see executor.h).
  using RunCounts = Executor::RunCounts;
  RunCounts collectives_run() const { return executor_->counts(); }
  const FlightRecorder& flight_recorder() const { return *recorder_; }
  // How many all-reduces took the symmetric path (algorithms/symmetric_all_reduce.h).
  uint64_t symmetric_collectives() const { return symmetric_collectives_.load(std::memory_order_relaxed); }
  // How many took the slot path (small all-reduces inside a host), and whether the group may take it.
  uint64_t slot_collectives() const { return slot_collectives_.load(std::memory_order_relaxed); }
  bool slots_enabled() const { return slots_ != nullptr; }
  // How many took the staged path (large all-reduces of ordinary memory inside a host), and whether
  // the group may take it.
  uint64_t staged_collectives() const { return staged_collectives_.load(std::memory_order_relaxed); }
  bool staging_enabled() const { return staging_ != nullptr; }
  // How many took the cross-memory path (process_vm_readv), and whether the group may take it.
  uint64_t cross_memory_collectives() const { return cross_memory_collectives_.load(std::memory_order_relaxed); }
  bool cross_memory_enabled() const { return cross_memory_ != nullptr; }

 private:
  struct Hosts;
  Hosts meet_hosts(const std::string& prefix);
  void open_transports(const std::string& prefix, const Hosts& hosts);
  void choose_waiting(const Hosts& hosts);
  CostModel agree_on_cost_model(const std::string& prefix, const HostLayout& layout);

  // A collective call: `body(ctx, tensors...)` is what it does once it runs. A call its caller runs
  // at once (Executor::submit) borrows the body and the caller's tensors; a queued one owns copies,
  // as the caller may return before it runs. `in_symmetric_memory`: the collective reads and writes
  // only symmetric memory of this host's ranks, so it moves no bytes through a fifo and a blocking
  // caller may run it at any size up to tuning::kBlockingCallerSymmetricBytes.
  template <class Body, class... Tensors>
  WorkPtr submit(Fingerprint fingerprint, const CallOptions& call, bool in_symmetric_memory, const Body& body,
                 const Tensors&... tensors) {
    auto here = [&](const CollectiveContext& ctx) { body(ctx, tensors...); };
    auto owned = [&] {
      return Executor::Body([body, ... held = tensors](const CollectiveContext& ctx) { body(ctx, held...); });
    };
    return submit_task(std::move(fingerprint), call, in_symmetric_memory, here, owned);
  }
  // Numbers the call, records it, and runs it here or queues it (with `owned_body()`).
  WorkPtr submit_task(Fingerprint fingerprint, const CallOptions& call, bool in_symmetric_memory,
                      Executor::BodyRef body, FunctionRef<Executor::Body()> owned_body);
  void run_task(const Executor::Task& task, Executor::BodyRef body);
  // Adds to a timed-out collective's problem and hint what the watchdog knows of the stall.
  void explain_timeout(const Executor::Task& task, std::string& problem, std::string& advice);
  void check_fingerprints(const Fingerprint& mine, const CollectiveContext& ctx);
  void all_reduce_bytes(const std::byte* in, std::byte* out, size_t count, const CollectiveContext& ctx);
  // One tensor, in place, by the first way that takes it: its symmetric buffer (`part`, symmetric_part's
  // answer), process_vm_readv, or all_reduce_bytes (a CUDA tensor through a pinned host copy).
  void all_reduce_in_place(const Tensor& tensor, const std::optional<SymmetricMemory::Found>& part,
                           const CollectiveContext& ctx);
  // The symmetric path for `count` elements in place in `part` (symmetric_part; none: not symmetric):
  // algorithms/symmetric_all_reduce.h when every rank is on this host, and
  // algorithms/symmetric_hierarchical_all_reduce.h where the ranks span hosts and the selector takes
  // the hierarchical algorithm; false: not taken.
  bool symmetric_all_reduce_bytes(const std::optional<SymmetricMemory::Found>& part, size_t count,
                                  const CollectiveContext& ctx);
  // The symmetric buffer a CPU tensor lies in, and where (is_symmetric's lookup).
  std::optional<SymmetricMemory::Found> symmetric_part(const Tensor& t) const;
  // symmetric_part, when every rank is on this host and the tensor is not empty.
  std::optional<SymmetricMemory::Found> symmetric_window(const Tensor& t) const;
  // Reduce-scatter from, and all-gather into, symmetric memory (algorithms/symmetric_scatter_gather.h)
  // when every rank is on this host; false: not taken.
  bool symmetric_reduce_scatter_bytes(const Tensor& output, const Tensor& input, const CollectiveContext& ctx);
  bool symmetric_all_gather_bytes(const Tensor& output, const Tensor& input, const CollectiveContext& ctx);
  // The slot path (algorithms/slot_all_reduce.h) for a small all-reduce of any CPU memory, when every
  // rank is on this host and the FIFO path would take the direct exchange; false: not taken.
  bool slot_all_reduce_bytes(const std::byte* in, std::byte* out, size_t count, const CollectiveContext& ctx);
  // The staged path (algorithms/staged_all_reduce.h) for a large all-reduce of any CPU memory, when
  // every rank is on this host and the FIFO path would take the ring; false: not taken.
  bool staged_all_reduce_bytes(const std::byte* in, std::byte* out, size_t count, const CollectiveContext& ctx);
  // The same for an ordinary CPU tensor through process_vm_readv (algorithms/cross_memory_all_reduce.h),
  // when the group agreed it may (open_cross_memory) and the tensor is large enough (tuning.h).
  bool cross_memory_all_reduce_bytes(const Tensor& t, const CollectiveContext& ctx);
  void open_cross_memory(const std::string& prefix, const Hosts& hosts);
  Ring ring();
  Connection* peer(int r);                   // the connection to rank r, fetched on first use
  std::span<Connection* const> all_peers();  // every rank's (nullptr at this rank)

  std::shared_ptr<Store> store_;
  ProcessGroupOptions options_;
  bool debug_detail_;
  size_t small_message_bytes_;
  size_t blocking_caller_bytes_ = 0;  // the largest collective a blocking caller runs itself (executor.h)
  WaitPolicy wait_;
  int cpu_ = -1;                                   // the communication thread's CPU (-1: unbound)
  bool shares_cpus_with_peers_ = true;             // some local peer may run on one of this rank's CPUs
  std::unique_ptr<AllReduceSelector> all_reduce_;  // which all-reduce algorithm runs
  std::unique_ptr<ShmTransport> shm_;
  std::unique_ptr<TcpTransport> tcp_;
  std::unique_ptr<SymmetricMemory> symmetric_;  // with shm_: this host's symmetric allocations
  bool all_local_ = false;                      // every rank of the group is on this host
  std::atomic<uint64_t> symmetric_collectives_{0};
  std::shared_ptr<SymmetricBuffer> slots_;  // with all_local_: the small all-reduces' slots
  std::atomic<uint64_t> slot_collectives_{0};
  std::shared_ptr<SymmetricBuffer> staging_;  // with all_local_: the large all-reduces' staging
  std::atomic<uint64_t> staged_collectives_{0};
  std::shared_ptr<SymmetricBuffer> cross_memory_;  // set when every local rank may read the others
  size_t cross_memory_from_bytes_ = 0;             // the least tensor it takes (open_cross_memory)
  std::vector<int> local_pids_;                    // by position among the local ranks
  std::atomic<uint64_t> cross_memory_collectives_{0};
  std::vector<Connection*> peers_;  // by rank, once used; nullptr at this rank
  std::vector<Transport*> routes_;  // by rank: the transport that reaches it; nullptr at this rank
  std::vector<Transport*> transports_;
  uint64_t next_sequence_ = 0;  // the next collective's number (under the executor's lock: Executor::submit)
  std::string aborted_;         // the first failure's message, once the group is aborted
  std::unique_ptr<FlightRecorder> recorder_;      // this group's last collectives (flight_recorder.h)
  std::unique_ptr<CollectiveWatchdog> watchdog_;  // progress lines and stall verdicts (collective_watchdog.h)
  std::shared_ptr<Executor> executor_;
};

}  // namespace tinyddp::comm
