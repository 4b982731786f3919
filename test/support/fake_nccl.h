// Fake NCCL: the nccl backend's calls answered on fake CUDA devices (test/support/fake_cuda.h), so that the
// backend itself -- and DDP, MultiDevice and the Trainer above it -- run their NCCL path on machines
// without a GPU. The data moves through the host backend (over shared memory or TCP, between threads
// or processes), and NCCL's rules are enforced, each where NCCL itself enforces it:
//   - buffers are device memory of the communicator's device, which is the calling thread's current
//     device when ncclCommInitRank runs; the stream is a stream of that device;
//   - one GPU per rank: two ranks on one host and one device fail at init ("Duplicate GPU detected");
//   - a non-blocking communicator answers ncclInProgress after each call, and must be polled with
//     ncclCommGetAsyncError until it says ncclSuccess before it is used again; ncclCommFinalize is
//     such a call; ncclCommDestroy on a communicator still in progress fails, frees nothing, and
//     leaves the calling thread inside a group (later calls on that thread are then only queued);
//   - one thread at a time per communicator (NCCL's thread-safety rule): a second thread calling in
//     while another is inside is recorded as a violation and refused;
//   - avg of floats multiplies each input by 1/n before summing (NCCL's PreMulSum), so its results
//     differ from sum/n in the last bits, as they do on a GPU.
// The unique id carries the address of a store that rank 0's process hosts, as NCCL's carries the
// address of its bootstrap root.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "tinyddp/comm/nccl/nccl_api.h"

namespace tinyddp::comm {

struct FakeComm;

class FakeNccl final : public NcclApi {
 public:
  std::string describe() const override { return "fake NCCL (the host backend on fake CUDA devices)"; }
  NcclResult get_unique_id(NcclUniqueId* id) override;
  NcclResult comm_init_rank(NcclComm* comm, int nranks, const NcclUniqueId& id, int rank, bool blocking) override;
  NcclResult comm_get_async_error(NcclComm comm, NcclResult* state) override;
  NcclResult comm_finalize(NcclComm comm) override;
  NcclResult comm_destroy(NcclComm comm) override;
  NcclResult comm_abort(NcclComm comm) override;
  NcclResult group_start() override;
  NcclResult group_end() override;
  NcclResult all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, NcclComm comm,
                        CudaStream stream) override;
  NcclResult broadcast(const void* send, void* recv, size_t count, DType dtype, int root, NcclComm comm,
                       CudaStream stream) override;
  NcclResult all_gather(const void* send, void* recv, size_t count, DType dtype, NcclComm comm,
                        CudaStream stream) override;
  NcclResult reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, NcclComm comm,
                            CudaStream stream) override;
  std::string error_string(NcclResult result) override;
  std::string last_error(NcclComm comm) override;

  // ---- for tests ----
  size_t live_communicators() const;
  // The calling thread's group nesting: 0 unless a group was left open (see the header comment).
  int thread_group_depth() const;
  // Every breach of the one-thread-per-communicator rule seen so far.
  std::vector<std::string> violations() const;
  // Makes the next collective call of this process fail with `result` (a fault to test the caller's
  // error path with), NCCL's last error saying `message`.
  void fail_next_collective(NcclResult result, std::string message);
  // Makes every collective call stay inside the communicator this long before returning (the window in
  // which a second thread calling in collides with it); zero by default.
  void hold_collective_calls(std::chrono::milliseconds duration) { hold_ = duration; }

  struct Op;

 private:
  NcclResult enqueue(Op op);
  NcclResult call(Op op);
  NcclResult run_group();
  NcclResult finish_call(FakeComm* comm, NcclResult outcome);
  bool live(FakeComm* comm) const;
  void violation(const std::string& what);
  NcclResult fail(FakeComm* comm, NcclResult result, const std::string& message);

  mutable std::mutex mutex_;
  std::set<FakeComm*> comms_;
  std::vector<std::string> violations_;
  std::string last_error_;
  uint64_t next_id_ = 0;
  NcclResult injected_ = NcclResult::success;
  std::atomic<std::chrono::milliseconds> hold_{std::chrono::milliseconds(0)};
  std::string injected_message_;
};

// The process's fake NCCL.
FakeNccl& fake_nccl();

}  // namespace tinyddp::comm
