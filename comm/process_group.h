// ProcessGroup: the collectives every rank of a job calls together (PyTorch's c10d ProcessGroup).
//
//   auto store = std::make_shared<TcpStore>("10.0.0.1", 29500, rank == 0);
//   auto pg = create_process_group("host", store, rank, world);
//   pg->all_reduce(grad, ReduceOp::avg)->wait();
//
// One interface, two backends:
//   host  hand-written (host_backend.h): collectives on tensors in host memory, over TCP between
//         hosts and shared memory between ranks of one host; CUDA tensors are staged through
//         pinned host memory. Its algorithms (ring, direct, recursive doubling, ...) are chosen
//         per call (algorithms/algorithm_selection.h).
//   nccl  NVIDIA's library (comm/nccl/): CUDA tensors; built only when NCCL is found.
//
// Every collective returns at once with a Work (work.h) and runs on the group's communication
// thread, in call order; every rank must make the same calls in the same order. A call made with
// CallOptions::blocking returns only once its collective is done, as MPI's calls do. Each call is
// bounded by a timeout (the group's, or the call's own): a peer that never answers, or dies, ends
// the call with an error that names it instead of a hang. After such a failure the group is
// aborted: later calls fail at once, and the peers are told so they fail too.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tinyddp/comm/reduce_op.h"
#include "tinyddp/comm/store/store.h"
#include "tinyddp/comm/timeout.h"
#include "tinyddp/comm/work.h"
#include "tinyddp/core/tensor.h"

namespace tinyddp::comm {

struct ProcessGroupOptions {
  // Bounds every collective (from the moment it starts running) and the group's setup; also the
  // rendezvous of init_process_group. Default: TINYDDP_TIMEOUT, else 5 minutes (comm/timeout.h).
  std::chrono::milliseconds timeout = timeout_from_environment();
  // Groups created over one store must have distinct names (or be created in the same order on
  // every rank: the n-th group of a name on one rank meets the n-th group of that name elsewhere).
  std::string group_name = "default";
  // host backend: "tcp" | "shm" | "auto" (shared memory between ranks of a host, TCP otherwise).
  std::string transport = "auto";
  // TINYDDP_DEBUG=DETAIL's collective fingerprint check; unset: read the environment.
  std::optional<bool> debug_detail;
  // host backend: all-reduces of at most this many bytes use the one-round direct exchange;
  // unset: TINYDDP_SMALL_MESSAGE_BYTES, else the measured crossover (comm/tuning.h).
  std::optional<size_t> small_message_bytes;
  // host backend: the all-reduce algorithm, "auto" | "ring" | "direct" | "rd" (recursive doubling) |
  // "rabenseifner" | "hier" (hierarchical: in-host, then across hosts); empty: TINYDDP_ALGO, else
  // auto (comm/algorithms/algorithm_selection.h says how auto chooses).
  std::string algorithm;
  size_t shm_fifo_bytes = 0;         // 0: TINYDDP_SHM_FIFO_BYTES or the default (comm/tuning.h)
  size_t tcp_buffer_bytes = 0;       // 0: TINYDDP_TCP_BUFFER_BYTES or the kernel's auto-tuning
  std::optional<std::string> token;  // the job token for transport handshakes; unset: TINYDDP_TOKEN
  // nccl backend: the rank's CUDA device; -1: LOCAL_RANK's, else the rank's (core/device.h, default_cuda_device).
  int device = -1;
};

// Per-call settings.
struct CallOptions {
  std::chrono::milliseconds timeout{0};  // 0: the group's timeout
  int bucket = -1;                       // DDP's gradient bucket this call reduces, for the flight recorder; -1: none
  // The call returns once the collective is done, as MPI_Allreduce does (PyTorch's async_op=False), and
  // throws its error: the Work it returns is complete (on a device: the caller's stream is ordered
  // after it, as wait() does). On the host backend such a call runs the collective on the calling
  // thread when nothing is queued before it, past the queue a later wait() would take.
  bool blocking = false;
};

class ProcessGroup {
 public:
  ProcessGroup(int rank, int size) : rank_(rank), size_(size) {}
  virtual ~ProcessGroup() = default;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  virtual std::string backend() const = 0;

  // tensor = op over every rank's tensor, in place. avg of integers truncates toward zero.
  virtual WorkPtr all_reduce(const Tensor& tensor, ReduceOp op = ReduceOp::sum, const CallOptions& call = {}) = 0;
  // output = op over every rank's input (same dtype and element count); input is left untouched.
  virtual WorkPtr all_reduce_into(const Tensor& output, const Tensor& input, ReduceOp op = ReduceOp::sum,
                                  const CallOptions& call = {}) = 0;
  // Several all-reduces as one call: NCCL launches them as one group, the host backend runs them back to back.
  virtual WorkPtr all_reduce_coalesced(const std::vector<Tensor>& tensors, ReduceOp op = ReduceOp::sum,
                                       const CallOptions& call = {}) = 0;
  // tensor on every rank = tensor on `root`.
  virtual WorkPtr broadcast(const Tensor& tensor, int root = 0, const CallOptions& call = {}) = 0;
  // output (size() * input.numel() elements) = every rank's input, in rank order.
  virtual WorkPtr all_gather(const Tensor& output, const Tensor& input, const CallOptions& call = {}) = 0;
  // output = the rank()-th of size() equal parts of input, reduced over every rank.
  virtual WorkPtr reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op = ReduceOp::sum,
                                 const CallOptions& call = {}) = 0;
  // Completes once every rank has called it.
  virtual WorkPtr barrier(const CallOptions& call = {}) = 0;

  // ---- symmetric memory (comm/symmetric/symmetric_memory.h) ----
  // A CPU tensor in memory that every rank of this host maps (as NCCL's ncclMemAlloc with a window
  // registered, or PyTorch's symmetric memory): all_reduce on it reads the peers' data where it
  // lies, with no FIFO and no staging copy. Every rank calls it, in the same order, with the same
  // shape and dtype (a collective call among the ranks of the host). Where the group has no shared
  // memory (one rank per host, transport tcp, the nccl backend) it returns an ordinary tensor, and
  // collectives on it run as on any other.
  virtual Tensor allocate_symmetric(const Shape& shape, DType dtype = DType::f32);
  // True when `t` lies in this group's symmetric memory, so that its collectives take that path.
  virtual bool is_symmetric(const Tensor& /*t*/) const { return false; }

  // ---- 16-bit floats that round once (comm/algorithms/single_rounding.h) ----
  // all_reduce of a bf16 or f16 tensor (op sum or avg) that sums every rank's 16-bit value in f32, in
  // rank order, and rounds once: the error does not grow with the world size, as a 16-bit ring's
  // does (one rounding per hop), and the bytes on the wire are those of all_reduce in 16 bits, half
  // of f32's. The host backend offers both; the base class throws, naming the backend.
  virtual WorkPtr all_reduce_single_rounding(const Tensor& tensor, ReduceOp op = ReduceOp::sum,
                                             const CallOptions& call = {});
  // reduce_scatter (output = the rank()-th of size() equal parts of input) with the same single rounding.
  virtual WorkPtr reduce_scatter_single_rounding(const Tensor& output, const Tensor& input, ReduceOp op = ReduceOp::sum,
                                                 const CallOptions& call = {});

  // The collectives this rank ran so far and the seconds they took, start to end: the transfers plus
  // the time spent waiting for the other ranks. Every rank moves the same bytes, so a rank whose
  // total is far below the others' is the one they wait for (a straggler). The nccl backend counts
  // from the hand-over to NCCL to the end event, which also covers waiting on the stream behind
  // earlier collectives.
  struct CollectiveTime {
    uint64_t collectives = 0;
    double seconds = 0;
  };
  virtual CollectiveTime time_in_collectives() const { return {}; }

 protected:
  // Argument checks shared by the backends: they throw in the caller's thread, before anything
  // is queued, with the collective's name in the message.
  void check_tensor(const Tensor& t, const char* collective, const char* role) const;
  void check_same(const Tensor& a, const Tensor& b, const char* collective) const;
  void check_root(int root, const char* collective) const;

 private:
  int rank_, size_;
};

// The backends that can be created here: always "host", plus "nccl" when this build has NCCL and its
// half (libtinyddp_nccl.so) is found, or when fake CUDA devices stand in for GPUs (tests).
std::vector<std::string> available_backends();

// Whether `backend` is one of available_backends().
bool backend_available(const std::string& backend);
// Why `backend` is not available here ("" when it is): for nccl, the cached reason its half did not
// load (comm/nccl/nccl_api.h), which MultiDevice logs when it falls back to the host backend.
std::string backend_unavailable_reason(const std::string& backend);

// Creates `backend` ("host" or "nccl") for `rank` of `world`, meeting the other ranks through
// `store`. Blocks until every rank has joined (bounded by options.timeout).
std::shared_ptr<ProcessGroup> create_process_group(const std::string& backend, std::shared_ptr<Store> store, int rank,
                                                   int world, const ProcessGroupOptions& options = {});

// The one-call start of a job, as torch.distributed.init_process_group: rendezvous through
// `init_method` ("tcp://host:port", rank 0 hosting the store; or "env://" under tinyddp-run,
// torchrun, srun or mpirun, see rendezvous.h), then create_process_group. rank / world = -1 take
// them from the environment. The group keeps the store (and, on rank 0, its server) alive.
std::shared_ptr<ProcessGroup> init_process_group(const std::string& backend, const std::string& init_method = "env://",
                                                 int rank = -1, int world = -1,
                                                 const ProcessGroupOptions& options = {});

}  // namespace tinyddp::comm
