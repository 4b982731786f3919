#include "test/support/fake_nccl.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <span>
#include <sstream>
#include <thread>
#include <type_traits>
#include <utility>

#include "tinyddp/comm/process_group.h"
#include "tinyddp/comm/store/prefix_store.h"
#include "tinyddp/comm/store/tcp_store.h"
#include "tinyddp/comm/transport/shm_transport.h"
#include "tinyddp/core/cuda_runtime.h"
#include "test/support/fake_cuda.h"

namespace tinyddp::comm {

enum class OpKind { all_reduce, broadcast, all_gather, reduce_scatter };

struct FakeNccl::Op {
  OpKind kind;
  const void* send;
  void* recv;
  size_t count;
  DType dtype;
  ReduceOp op;
  int root;
  FakeComm* comm;
  CudaStream stream;
};

struct FakeComm {
  int device = 0, rank = 0, nranks = 1;
  bool blocking = false;
  std::shared_ptr<TcpStore> root;  // the bootstrap store, when this process hosts it
  std::shared_ptr<TcpStore> store;
  std::shared_ptr<ProcessGroup> host;  // the host backend that moves the data
  // What ncclCommGetAsyncError answers now, and what it answers after reporting in_progress once.
  NcclResult state = NcclResult::success;
  NcclResult next_state = NcclResult::success;
  bool finalized = false;
  std::string error;
  std::atomic<std::thread::id> caller{};  // the thread inside a call on this communicator
  // Collectives queued on streams and not yet run (or skipped, after an abort): the communicator is
  // freed only when none is left, and ncclCommFinalize is in progress until then.
  std::mutex queued_mutex;
  std::condition_variable queued_changed;
  int queued = 0;
  std::atomic<bool> aborted{false};
  // A collective that failed on its stream: what ncclCommGetAsyncError reports from then on.
  std::atomic<NcclResult> async_error{NcclResult::success};

  void wait_until_idle() {
    std::unique_lock<std::mutex> lock(queued_mutex);
    queued_changed.wait(lock, [&] { return queued == 0; });
  }
  int in_flight() {
    std::lock_guard<std::mutex> lock(queued_mutex);
    return queued;
  }
};

namespace {

constexpr const char* kIdMagic = "tinyddp-fake-nccl";

// A thread's open groups: ncclGroupStart nesting and the calls queued inside.
struct ThreadGroup {
  int depth = 0;
  std::vector<FakeNccl::Op> ops;
  NcclResult error = NcclResult::success;
};
thread_local ThreadGroup t_group;

// Unique ids of this process: the bootstrap store each one names (kept for the ranks that join).
std::mutex g_roots_mutex;
std::vector<std::pair<std::string, std::shared_ptr<TcpStore>>> g_roots;

FakeCuda& fake_devices() {
  FakeCuda* fake = active_fake_cuda();
  TINYDDP_CHECK(fake != nullptr, "fake NCCL needs fake CUDA devices",
                hint("set TINYDDP_FAKE_CUDA_DEVICES or create a "
                     "FakeCudaDevices in the test"));
  return *fake;
}

bool is_float(DType t) { return is_floating_dtype(t); }

// NCCL's PreMulSum for avg: every input times 1/n, the factor and each product rounded to the dtype
// (products of 16-bit floats computed in f32, as NCCL's kernels do), then a sum.
void premultiply_by_inverse(Tensor& in, size_t count, size_t n) {
  dispatch_dtype(in.dtype(), [&](auto zero) {
    using T = decltype(zero);
    if constexpr (std::is_same_v<T, double>) {
      for (double& v : std::span(in.data<double>(), count)) v *= 1.0 / double(n);
    } else if constexpr (std::is_same_v<T, float> || std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>) {
      const float factor = float(T(float(1.0 / double(n))));
      for (T& v : std::span(in.data<T>(), count)) v = T(float(v) * factor);
    }
  });
}

// One thread at a time per communicator: claimed for the length of a call.
class CallClaim {
 public:
  CallClaim(FakeComm* comm, const char* call) : comm_(comm) {
    std::thread::id none;
    claimed_ = comm->caller.compare_exchange_strong(none, std::this_thread::get_id());
    if (!claimed_) {
      std::ostringstream out;
      out << call << " on thread " << std::this_thread::get_id() << " while thread " << none
          << " was inside another call on the same communicator";
      breach_ = out.str();
    }
  }
  ~CallClaim() {
    if (claimed_) comm_->caller.store(std::thread::id());
  }
  CallClaim(const CallClaim&) = delete;
  CallClaim& operator=(const CallClaim&) = delete;
  const std::string& breach() const { return breach_; }

 private:
  FakeComm* comm_;
  bool claimed_ = false;
  std::string breach_;
};

// The collective itself, on host copies of the device buffers (fake device memory is host memory).
void move_data(const FakeNccl::Op& op) {
  FakeComm& c = *op.comm;
  const size_t item = dtype_size(op.dtype), n = size_t(c.nranks);
  const bool gather = op.kind == OpKind::all_gather, scatter = op.kind == OpKind::reduce_scatter;
  const size_t in_count = scatter ? op.count * n : op.count, out_count = gather ? op.count * n : op.count;
  Tensor in = Tensor::empty({int64_t(in_count)}, op.dtype);
  Tensor out = (gather || scatter) ? Tensor::empty({int64_t(out_count)}, op.dtype) : in;
  const bool sends = op.kind != OpKind::broadcast || c.rank == op.root;
  if (sends && in_count > 0) std::memcpy(in.raw_data(), op.send, in_count * item);
  ReduceOp reduce = op.op;
  if (reduce == ReduceOp::avg && is_float(op.dtype)) {
    premultiply_by_inverse(in, in_count, n);
    reduce = ReduceOp::sum;
  }
  switch (op.kind) {
    case OpKind::all_reduce: c.host->all_reduce(in, reduce)->wait(); break;
    case OpKind::broadcast: c.host->broadcast(in, op.root)->wait(); break;
    case OpKind::all_gather: c.host->all_gather(out, in)->wait(); break;
    case OpKind::reduce_scatter: c.host->reduce_scatter(out, in, reduce)->wait(); break;
  }
  if (out_count > 0) std::memcpy(op.recv, out.raw_data(), out_count * item);
}

// NCCL's argument checks: device memory of the communicator's device, a stream of that device.
std::string check_arguments(const FakeNccl::Op& op) {
  FakeCuda& fake = fake_devices();
  const FakeComm& c = *op.comm;
  const size_t item = dtype_size(op.dtype), n = size_t(c.nranks);
  const size_t send_bytes = op.count * item * (op.kind == OpKind::reduce_scatter ? n : 1);
  const size_t recv_bytes = op.count * item * (op.kind == OpKind::all_gather ? n : 1);
  auto where = [&](int device) {
    return device < 0 ? std::string("not device memory") : "memory of cuda:" + std::to_string(device);
  };
  const bool sends = op.kind != OpKind::broadcast || c.rank == op.root;
  if (sends && send_bytes > 0 && fake.device_of(op.send, send_bytes) != c.device)
    return "sendbuff (" + std::to_string(send_bytes) + " bytes) is " + where(fake.device_of(op.send, send_bytes)) +
           ", but the communicator's device is cuda:" + std::to_string(c.device);
  if (recv_bytes > 0 && fake.device_of(op.recv, recv_bytes) != c.device)
    return "recvbuff (" + std::to_string(recv_bytes) + " bytes) is " + where(fake.device_of(op.recv, recv_bytes)) +
           ", but the communicator's device is cuda:" + std::to_string(c.device);
  if (fake.stream_device(op.stream) != c.device)
    return "the stream belongs to cuda:" + std::to_string(fake.stream_device(op.stream)) +
           ", the communicator to cuda:" + std::to_string(c.device);
  return "";
}

// ncclCommInitRank's own checks, once every rank has joined: one GPU per rank on each host.
std::string duplicate_gpu(FakeComm& c, Store& store) {
  store.set("device/" + std::to_string(c.rank), host_identity() + " " + std::to_string(c.device));
  std::vector<std::string> keys;
  for (int r = 0; r < c.nranks; ++r) keys.push_back("device/" + std::to_string(r));
  store.wait(keys, std::chrono::seconds(60));
  std::vector<std::string> places = store.multi_get(keys);
  for (int r = 0; r < c.nranks; ++r)
    if (r != c.rank && places[size_t(r)] == places[size_t(c.rank)])
      return "Duplicate GPU detected : rank " + std::to_string(std::min(r, c.rank)) + " and rank " +
             std::to_string(std::max(r, c.rank)) + " both on CUDA device " + std::to_string(c.device);
  return "";
}

// Before a communicator is freed: the last one of this process holding the bootstrap store takes it
// out of the list, so that freeing the communicator ends the store's server. Its server then waits
// only for clients of other processes: ranks that are threads of one process and are torn down one
// after another would otherwise keep each other's server waiting for its linger time.
void release_root(FakeComm* comm) {
  if (!comm->root) return;
  std::lock_guard<std::mutex> lock(g_roots_mutex);
  auto it = std::find_if(g_roots.begin(), g_roots.end(), [&](const auto& r) { return r.second == comm->root; });
  if (it != g_roots.end() && comm->root.use_count() == 2) g_roots.erase(it);
}

}  // namespace

FakeNccl& fake_nccl() {
  static FakeNccl* nccl = new FakeNccl;  // never destroyed: communicators may be torn down at exit
  return *nccl;
}

namespace {
// A program linked with this library gets the fake NCCL whenever fake devices are in use.
[[maybe_unused]] const bool g_stand_in_registered = (set_nccl_stand_in([]() -> NcclApi& { return fake_nccl(); }), true);
}  // namespace

bool FakeNccl::live(FakeComm* comm) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return comms_.count(comm) > 0;
}

void FakeNccl::violation(const std::string& what) {
  std::lock_guard<std::mutex> lock(mutex_);
  violations_.push_back(what);
  last_error_ = "fake NCCL: two threads at once: " + what + " (NCCL allows one thread at a time per communicator)";
}

NcclResult FakeNccl::fail(FakeComm* comm, NcclResult result, const std::string& message) {
  std::lock_guard<std::mutex> lock(mutex_);
  last_error_ = "fake NCCL: " + message;
  if (comm) comm->error = last_error_;
  return result;
}

NcclResult FakeNccl::get_unique_id(NcclUniqueId* id) {
  auto root = std::make_shared<TcpStore>("127.0.0.1", 0, true);
  std::string text;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    text = std::string(kIdMagic) + " 127.0.0.1 " + std::to_string(root->port()) + " " + std::to_string(::getpid()) +
           "-" + std::to_string(next_id_++);
  }
  id->fill('\0');
  std::memcpy(id->data(), text.data(), std::min(text.size(), id->size() - 1));
  std::lock_guard<std::mutex> lock(g_roots_mutex);
  g_roots.emplace_back(text, std::move(root));
  return NcclResult::success;
}

NcclResult FakeNccl::comm_init_rank(NcclComm* out, int nranks, const NcclUniqueId& id, int rank, bool blocking) {
  *out = nullptr;
  std::istringstream in(std::string(id.data()));
  std::string magic, host, name;
  int port = 0;
  in >> magic >> host >> port;
  name = std::string(id.data());
  if (magic != kIdMagic) return fail(nullptr, NcclResult::invalid_argument, "the unique id was not made by fake NCCL");
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return fail(nullptr, NcclResult::invalid_argument, "Invalid rank requested");
  auto comm = std::make_unique<FakeComm>();
  comm->device = cuda_current_device();  // NCCL's device is the calling thread's current one
  comm->rank = rank;
  comm->nranks = nranks;
  comm->blocking = blocking;
  NcclResult outcome = NcclResult::success;
  try {
    fake_devices().touch(comm->device, "ncclCommInitRank");
    {
      // Every communicator of this process keeps the bootstrap store alive (the last one to go ends it,
      // once the others' clients have left; see release_root); ranks in other processes reach it by
      // its address.
      std::lock_guard<std::mutex> lock(g_roots_mutex);
      auto it = std::find_if(g_roots.begin(), g_roots.end(), [&](const auto& r) { return r.first == name; });
      if (it != g_roots.end()) comm->root = it->second;
    }
    comm->store = std::make_shared<TcpStore>(host, port, false);
    auto scoped = std::make_shared<PrefixStore>(comm->store, "fake-nccl");
    ProcessGroupOptions options;
    options.group_name = "fake-nccl";
    options.timeout = std::chrono::seconds(60);
    comm->host = create_process_group("host", scoped, rank, nranks, options);
    if (std::string duplicate = duplicate_gpu(*comm, *scoped); !duplicate.empty())
      outcome = fail(comm.get(), NcclResult::invalid_usage, duplicate);
  } catch (const std::exception& e) {
    outcome = fail(comm.get(), NcclResult::system_error, std::string("init failed: ") + e.what());
  }
  FakeComm* made = comm.release();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    comms_.insert(made);
  }
  *out = made;
  return finish_call(made, outcome);
}

// A non-blocking communicator reports in_progress, and the outcome at the next poll; a blocking one
// reports the outcome at once.
NcclResult FakeNccl::finish_call(FakeComm* comm, NcclResult outcome) {
  if (comm->blocking) {
    comm->state = outcome;
    return outcome;
  }
  comm->state = NcclResult::in_progress;
  comm->next_state = outcome;
  return NcclResult::in_progress;
}

NcclResult FakeNccl::comm_get_async_error(NcclComm handle, NcclResult* state) {
  auto* comm = static_cast<FakeComm*>(handle);
  if (!live(comm)) return fail(nullptr, NcclResult::invalid_argument, "ncclCommGetAsyncError: not a live communicator");
  CallClaim claim(comm, "ncclCommGetAsyncError");
  if (!claim.breach().empty()) {
    violation(claim.breach());
    return NcclResult::invalid_usage;
  }
  if (comm->finalized && comm->in_flight() > 0) {  // finalize flushes the queued collectives first
    *state = NcclResult::in_progress;
    return NcclResult::success;
  }
  *state = comm->state;
  if (comm->state == NcclResult::in_progress) comm->state = comm->next_state;
  if (*state == NcclResult::success) *state = comm->async_error.load();
  return NcclResult::success;
}

NcclResult FakeNccl::comm_finalize(NcclComm handle) {
  auto* comm = static_cast<FakeComm*>(handle);
  if (!live(comm)) return fail(nullptr, NcclResult::invalid_argument, "ncclCommFinalize: not a live communicator");
  CallClaim claim(comm, "ncclCommFinalize");
  if (!claim.breach().empty()) {
    violation(claim.breach());
    return NcclResult::invalid_usage;
  }
  if (comm->state == NcclResult::in_progress)
    return fail(comm, NcclResult::invalid_argument,
                "Attempt to use communicator before the previous operation returned ncclSuccess");
  if (comm->finalized) return fail(comm, NcclResult::invalid_argument, "ncclCommFinalize called twice");
  comm->finalized = true;
  return finish_call(comm, NcclResult::success);
}

NcclResult FakeNccl::comm_destroy(NcclComm handle) {
  auto* comm = static_cast<FakeComm*>(handle);
  if (comm == nullptr) return NcclResult::success;
  if (!live(comm)) return fail(nullptr, NcclResult::invalid_argument, "ncclCommDestroy: not a live communicator");
  // As NCCL 2.28 does: the call opens a group first, and returns before closing it when the
  // communicator is not ready -- leaking the communicator and leaving the thread inside a group.
  ++t_group.depth;
  {
    CallClaim claim(comm, "ncclCommDestroy");
    if (!claim.breach().empty()) {
      violation(claim.breach());
      return NcclResult::invalid_usage;
    }
    if (comm->state == NcclResult::in_progress)
      return fail(comm, NcclResult::invalid_argument,
                  "Attempt to use communicator before the previous operation returned ncclSuccess");
  }
  comm->wait_until_idle();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    comms_.erase(comm);
  }
  release_root(comm);
  delete comm;
  --t_group.depth;
  return NcclResult::success;
}

NcclResult FakeNccl::comm_abort(NcclComm handle) {
  auto* comm = static_cast<FakeComm*>(handle);
  if (comm == nullptr) return NcclResult::success;
  if (!live(comm)) return fail(nullptr, NcclResult::invalid_argument, "ncclCommAbort: not a live communicator");
  {
    CallClaim claim(comm, "ncclCommAbort");
    if (!claim.breach().empty()) {
      violation(claim.breach());
      return NcclResult::invalid_usage;
    }
  }
  // Queued collectives are dropped; one already running (blocked on a peer, say) ends first, as NCCL's
  // abort stops its kernels before freeing the communicator.
  comm->aborted = true;
  comm->wait_until_idle();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    comms_.erase(comm);
  }
  release_root(comm);
  delete comm;
  return NcclResult::success;
}

NcclResult FakeNccl::group_start() {
  ++t_group.depth;
  return NcclResult::success;
}

NcclResult FakeNccl::group_end() {
  if (t_group.depth == 0) return fail(nullptr, NcclResult::invalid_usage, "ncclGroupEnd without ncclGroupStart");
  if (--t_group.depth > 0) return NcclResult::success;
  return run_group();
}

NcclResult FakeNccl::enqueue(Op op) {
  if (!live(op.comm))
    return fail(nullptr, NcclResult::invalid_argument, "collective on a communicator that is not live");
  CallClaim claim(op.comm, "a collective");
  if (!claim.breach().empty()) {
    violation(claim.breach());
    return NcclResult::invalid_usage;
  }
  NcclResult injected = NcclResult::success;
  std::string injected_message;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    injected = std::exchange(injected_, NcclResult::success);
    injected_message = injected_message_;
  }
  if (injected != NcclResult::success) {
    t_group.error = fail(op.comm, injected, injected_message);
    return t_group.error;
  }
  if (op.comm->state == NcclResult::in_progress) {
    t_group.error = fail(op.comm, NcclResult::invalid_argument,
                         "Attempt to use communicator before the previous operation returned ncclSuccess");
    return t_group.error;
  }
  if (std::string wrong = check_arguments(op); !wrong.empty()) {
    t_group.error = fail(op.comm, NcclResult::invalid_argument, wrong);
    return t_group.error;
  }
  t_group.ops.push_back(op);
  if (hold_.load().count() > 0) std::this_thread::sleep_for(hold_.load());
  return NcclResult::success;
}

// A collective outside ncclGroupStart/End is a group of one, as in NCCL.
NcclResult FakeNccl::call(Op op) {
  if (t_group.depth > 0) return enqueue(op);  // runs at the group's end
  ++t_group.depth;
  NcclResult queued = enqueue(op);
  --t_group.depth;
  if (queued != NcclResult::success) {
    t_group.ops.clear();
    t_group.error = NcclResult::success;
    return queued;
  }
  return run_group();
}

// Launches the calls queued on this thread, each on its stream (they run later, in stream order, with
// their output poisoned until then); each communicator's launch outcome becomes its state. A collective
// that fails on its stream sets the communicator's asynchronous error, as a failing NCCL kernel does.
NcclResult FakeNccl::run_group() {
  std::vector<Op> ops = std::move(t_group.ops);
  t_group.ops.clear();
  NcclResult error = std::exchange(t_group.error, NcclResult::success);
  if (error != NcclResult::success) return error;
  std::vector<std::pair<FakeComm*, NcclResult>> outcomes;
  for (const Op& op : ops) {
    CallClaim claim(op.comm, "ncclGroupEnd");
    if (!claim.breach().empty()) {
      violation(claim.breach());
      return NcclResult::invalid_usage;
    }
    const size_t recv_bytes = op.count * dtype_size(op.dtype) *
                              (op.kind == OpKind::all_gather ? size_t(op.comm->nranks) : 1);
    {
      std::lock_guard<std::mutex> lock(op.comm->queued_mutex);
      ++op.comm->queued;
    }
    fake_devices().launch(op.stream, "a fake NCCL collective", {{op.recv, recv_bytes}}, [this, op] {
      FakeComm* comm = op.comm;
      if (!comm->aborted) {
        try {
          move_data(op);
        } catch (const std::exception& e) {
          comm->async_error = fail(comm, NcclResult::remote_error, e.what());
        }
      }
      std::lock_guard<std::mutex> lock(comm->queued_mutex);
      --comm->queued;
      comm->queued_changed.notify_all();
    });
    if (std::find_if(outcomes.begin(), outcomes.end(), [&](const auto& o) { return o.first == op.comm; }) ==
        outcomes.end())
      outcomes.emplace_back(op.comm, NcclResult::success);
  }
  NcclResult result = NcclResult::success;
  for (auto& [comm, outcome] : outcomes) {
    NcclResult r = finish_call(comm, outcome);
    if (r != NcclResult::success) result = r;
  }
  return result;
}

NcclResult FakeNccl::all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, NcclComm comm,
                                CudaStream stream) {
  return call({OpKind::all_reduce, send, recv, count, dtype, op, 0, static_cast<FakeComm*>(comm), stream});
}
NcclResult FakeNccl::broadcast(const void* send, void* recv, size_t count, DType dtype, int root, NcclComm comm,
                               CudaStream stream) {
  return call({OpKind::broadcast, send, recv, count, dtype, ReduceOp::sum, root, static_cast<FakeComm*>(comm), stream});
}
NcclResult FakeNccl::all_gather(const void* send, void* recv, size_t count, DType dtype, NcclComm comm,
                                CudaStream stream) {
  return call({OpKind::all_gather, send, recv, count, dtype, ReduceOp::sum, 0, static_cast<FakeComm*>(comm), stream});
}
NcclResult FakeNccl::reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, NcclComm comm,
                                    CudaStream stream) {
  return call({OpKind::reduce_scatter, send, recv, count, dtype, op, 0, static_cast<FakeComm*>(comm), stream});
}

std::string FakeNccl::error_string(NcclResult result) {
  switch (result) {
    case NcclResult::success: return "no error";
    case NcclResult::unhandled_cuda_error: return "unhandled cuda error";
    case NcclResult::system_error: return "unhandled system error";
    case NcclResult::internal_error: return "internal error";
    case NcclResult::invalid_argument: return "invalid argument";
    case NcclResult::invalid_usage: return "invalid usage";
    case NcclResult::remote_error: return "remote process exited or there was a network error";
    case NcclResult::in_progress: return "NCCL operation in progress";
  }
  return "unknown result code";
}

std::string FakeNccl::last_error(NcclComm) {
  std::lock_guard<std::mutex> lock(mutex_);
  return last_error_;
}

size_t FakeNccl::live_communicators() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return comms_.size();
}

int FakeNccl::thread_group_depth() const { return t_group.depth; }

void FakeNccl::fail_next_collective(NcclResult result, std::string message) {
  std::lock_guard<std::mutex> lock(mutex_);
  injected_ = result;
  injected_message_ = std::move(message);
}

std::vector<std::string> FakeNccl::violations() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return violations_;
}

}  // namespace tinyddp::comm
