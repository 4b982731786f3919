// The nccl backend: NVIDIA's collectives on CUDA tensors, behind the same ProcessGroup interface.
//
// What it adds around NCCL, and why:
//   - bootstrap: rank 0 makes the NCCL unique id and the store carries it to everyone;
//   - one communication stream per group, ordered after the compute stream with an event, so a
//     collective starts only when the kernels that produced its input have run, and compute
//     kernels launched meanwhile are not serialised behind the communication;
//   - a watchdog thread that completes each Work when its end event fires, polls
//     ncclCommGetAsyncError, and calls ncclCommAbort on a timeout or an asynchronous error (a dead
//     peer), so no rank hangs: NCCL's own kernels would otherwise spin forever;
//   - failure naming: an aborting rank writes its reason in the store; the others read them and
//     name the ranks that reported nothing (dead, hung, or not calling this collective);
//   - grouped launches (ncclGroupStart/End) for all_reduce_coalesced;
//   - the DETAIL fingerprint check through the store.
// The communicator is non-blocking (config.blocking = 0) so even its initialisation can be
// abandoned at the timeout instead of waiting forever for a rank that never comes.
#include "comm/nccl/nccl_backend.h"

#include <cuda_runtime_api.h>

#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "comm/debug_check.h"
#include "comm/nccl/nccl_check.h"
#include "core/cuda_check.h"
#include "core/cuda_runtime.h"

namespace tinyddp::comm {

namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    default: break;
  }
  TINYDDP_FAIL("nccl backend: no NCCL type for ", dtype_name(t), "; hint: use f32, f64, i32 or i64");
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::avg: return ncclAvg;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::min: return ncclMin;
    case ReduceOp::prod: return ncclProd;
  }
  return ncclSum;
}

void* ptr(const Tensor& t) { return Tensor(t).raw_data(); }

class NcclBackend : public ProcessGroup {
 public:
  NcclBackend(std::shared_ptr<Store> store, int rank, int size, const ProcessGroupOptions& options)
      : ProcessGroup(rank, size), store_(std::move(store)), options_(options),
        debug_detail_(options.debug_detail.value_or(debug_detail_from_environment())) {
    TINYDDP_CHECK(cuda_device_count() > 0, "nccl backend: no CUDA device (", cuda_unavailable_reason(),
                  "); hint: use the ring backend on machines without GPUs");
    device_ = options.device;
    if (device_ < 0) {
      const char* local = std::getenv("LOCAL_RANK");
      device_ = local && *local ? std::atoi(local) : rank % cuda_device_count();
    }
    TINYDDP_CHECK(device_ < cuda_device_count(), "nccl backend: rank ", rank, " wants cuda:", device_, " but only ",
                  cuda_device_count(), " devices exist; hint: run one rank per GPU (tinyddp-run -n <number of GPUs>)");
    CUDA_CHECK(cudaSetDevice(device_));

    const std::string base = "tinyddp/nccl/" + options.group_name + "/";
    const int64_t generation = store_->add(base + "generation/" + std::to_string(rank), 1);
    prefix_ = base + std::to_string(generation) + "/";
    ncclUniqueId id;
    if (rank == 0) {
      NCCL_CHECK(ncclGetUniqueId(&id));
      store_->set(prefix_ + "unique_id", std::string(reinterpret_cast<const char*>(&id), sizeof id));
    }
    store_->wait({prefix_ + "unique_id"}, options.timeout);
    std::string bytes = store_->get(prefix_ + "unique_id");
    TINYDDP_CHECK(bytes.size() == sizeof id, "nccl backend: the unique id in the store has ", bytes.size(), " bytes, not ",
                  sizeof id, "; hint: every rank must use the same NCCL version");
    std::memcpy(&id, bytes.data(), sizeof id);

    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // abortable: see the header comment
    NCCL_CHECK(ncclCommInitRankConfig(&comm_, size, id, rank, &config));
    settle(Clock::now() + options.timeout, "ncclCommInitRankConfig");

    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&inputs_ready_, cudaEventDisableTiming));
    watchdog_ = std::thread([this] { watch(); });
  }

  ~NcclBackend() override {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      // Let the issued collectives finish (bounded by their own deadlines), then stop watching.
      drained_.wait(lock, [&] { return pending_.empty() || !aborted_.empty(); });
      stop_ = true;
    }
    wake_.notify_all();
    watchdog_.join();
    if (comm_) {
      if (aborted_.empty()) ncclCommFinalize(comm_);
      aborted_.empty() ? ncclCommDestroy(comm_) : ncclCommAbort(comm_);
    }
    cudaEventDestroy(inputs_ready_);
    cudaStreamDestroy(stream_);
  }

  std::string backend() const override { return "nccl"; }

  WorkPtr all_reduce(const Tensor& t, ReduceOp op, const CallOptions& call) override {
    check_tensor(t, "all_reduce", "tensor");
    return launch(make_fingerprint(CollectiveKind::all_reduce, t, t.numel(), op), call, {t}, [=, this] {
      NCCL_CHECK(ncclAllReduce(ptr(t), ptr(t), size_t(t.numel()), nccl_type(t.dtype()), nccl_op(op), comm_, stream_));
    });
  }

  WorkPtr all_reduce_into(const Tensor& out, const Tensor& in, ReduceOp op, const CallOptions& call) override {
    check_tensor(out, "all_reduce_into", "output");
    check_tensor(in, "all_reduce_into", "input");
    check_same(out, in, "all_reduce_into");
    return launch(make_fingerprint(CollectiveKind::all_reduce, in, in.numel(), op), call, {out, in}, [=, this] {
      NCCL_CHECK(ncclAllReduce(ptr(in), ptr(out), size_t(in.numel()), nccl_type(in.dtype()), nccl_op(op), comm_, stream_));
    });
  }

  WorkPtr all_reduce_coalesced(const std::vector<Tensor>& tensors, ReduceOp op, const CallOptions& call) override {
    TINYDDP_CHECK(!tensors.empty(), "all_reduce_coalesced: no tensors were given; hint: pass at least one tensor");
    int64_t total = 0;
    for (const Tensor& t : tensors) {
      check_tensor(t, "all_reduce_coalesced", "tensor");
      total += t.numel();
    }
    // One launch for all of them: inside ncclGroupStart/End NCCL fuses the operations.
    return launch(make_fingerprint(CollectiveKind::all_reduce, tensors[0], total, op), call, tensors, [=, this] {
      for (const Tensor& t : tensors)
        NCCL_CHECK(ncclAllReduce(ptr(t), ptr(t), size_t(t.numel()), nccl_type(t.dtype()), nccl_op(op), comm_, stream_));
    });
  }

  WorkPtr broadcast(const Tensor& t, int root, const CallOptions& call) override {
    check_tensor(t, "broadcast", "tensor");
    check_root(root, "broadcast");
    Fingerprint f = make_fingerprint(CollectiveKind::broadcast, t, t.numel(), std::nullopt);
    f.root = root;
    return launch(f, call, {t}, [=, this] {
      NCCL_CHECK(ncclBroadcast(ptr(t), ptr(t), size_t(t.numel()), nccl_type(t.dtype()), root, comm_, stream_));
    });
  }

  WorkPtr all_gather(const Tensor& out, const Tensor& in, const CallOptions& call) override {
    check_tensor(out, "all_gather", "output");
    check_tensor(in, "all_gather", "input");
    TINYDDP_CHECK(out.dtype() == in.dtype() && out.numel() == in.numel() * size(), "all_gather: output ", out.describe(),
                  " must hold world size (", size(), ") x input ", in.describe(), "; hint: size the output accordingly");
    return launch(make_fingerprint(CollectiveKind::all_gather, in, in.numel(), std::nullopt), call, {out, in}, [=, this] {
      NCCL_CHECK(ncclAllGather(ptr(in), ptr(out), size_t(in.numel()), nccl_type(in.dtype()), comm_, stream_));
    });
  }

  WorkPtr reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op, const CallOptions& call) override {
    check_tensor(out, "reduce_scatter", "output");
    check_tensor(in, "reduce_scatter", "input");
    TINYDDP_CHECK(out.dtype() == in.dtype() && in.numel() == out.numel() * size(), "reduce_scatter: input ", in.describe(),
                  " must hold world size (", size(), ") x output ", out.describe(), "; hint: size the input accordingly");
    return launch(make_fingerprint(CollectiveKind::reduce_scatter, out, out.numel(), op), call, {out, in}, [=, this] {
      NCCL_CHECK(ncclReduceScatter(ptr(in), ptr(out), size_t(out.numel()), nccl_type(in.dtype()), nccl_op(op), comm_, stream_));
    });
  }

  WorkPtr barrier(const CallOptions& call) override {
    // A one-element all-reduce on the device; the Work completes when every rank has joined.
    Tensor token = Tensor::zeros({1}, DType::i32, Device::cuda(device_));
    return launch(make_fingerprint(CollectiveKind::barrier, Tensor(), 0, std::nullopt), call, {token}, [=, this] {
      NCCL_CHECK(ncclAllReduce(ptr(token), ptr(token), 1, ncclInt32, ncclSum, comm_, stream_));
    });
  }

 private:
  struct Pending {
    WorkPtr work;
    cudaEvent_t done;
    Clock::time_point deadline;
    std::vector<Tensor> keep_alive;  // the caching allocator must not reuse them while NCCL runs
  };

  void check_device(const Tensor& t) const {
    TINYDDP_CHECK(t.device() == Device::cuda(device_), "nccl backend: ", t.describe(), " is not on this rank's device cuda:",
                  device_, "; hint: move it with .to(Device::cuda(", device_, ")) or use the ring backend for CPU tensors");
  }

  WorkPtr launch(Fingerprint f, const CallOptions& call, std::vector<Tensor> tensors, const std::function<void()>& enqueue) {
    for (const Tensor& t : tensors) check_device(t);
    std::unique_lock<std::mutex> lock(launch_mutex_);
    {
      std::lock_guard<std::mutex> state(mutex_);
      TINYDDP_CHECK(aborted_.empty(), "nccl backend: rank ", rank(), " cannot launch ", collective_kind_name(CollectiveKind(f.kind)),
                    ": the group was aborted by an earlier failure: ", aborted_,
                    "; hint: handle that failure, then create a new process group on every rank");
    }
    f.sequence = sequence_++;
    auto timeout = call.timeout.count() > 0 ? call.timeout : options_.timeout;
    auto deadline = Clock::now() + timeout;
    if (debug_detail_ && size() > 1) check_fingerprints(f, deadline);
    auto work = std::make_shared<Work>(f);

    CUDA_CHECK(cudaSetDevice(device_));
    // The collective waits for the compute (legacy default) stream's work so far, not the reverse.
    CUDA_CHECK(cudaEventRecord(inputs_ready_, cudaStreamLegacy));
    CUDA_CHECK(cudaStreamWaitEvent(stream_, inputs_ready_, 0));
    NCCL_CHECK(ncclGroupStart());
    enqueue();
    NCCL_CHECK(ncclGroupEnd());
    settle(deadline, work->description().c_str());
    cudaEvent_t done;
    CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(done, stream_));
    {
      std::lock_guard<std::mutex> state(mutex_);
      pending_.push_back({work, done, deadline, std::move(tensors)});
    }
    wake_.notify_all();
    return work;
  }

  // A non-blocking communicator answers ncclInProgress until the call has been taken in.
  void settle(Clock::time_point deadline, const char* what) {
    for (;;) {
      ncclResult_t state = ncclSuccess;
      NCCL_CHECK(ncclCommGetAsyncError(comm_, &state));
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) {
        std::string reason = std::string(what) + ": NCCL failed: " + ncclGetErrorString(state) + " (" + ncclGetLastError(comm_) + ")";
        abort_all(reason);
        TINYDDP_FAIL("nccl backend: rank ", rank(), ": ", reason, culprits(), "; hint: NCCL_DEBUG=WARN shows NCCL's own log");
      }
      if (Clock::now() > deadline) {
        std::string reason = std::string(what) + ": timed out after " + std::to_string(options_.timeout.count()) + " ms";
        abort_all(reason);
        TINYDDP_FAIL("nccl backend: rank ", rank(), ": ", reason, culprits(),
                     "; hint: every rank must make the same calls; raise the timeout if the job is just slow");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  void check_fingerprints(const Fingerprint& mine, Clock::time_point deadline) {
    const std::string key = prefix_ + "fingerprint/" + std::to_string(mine.sequence) + "/";
    store_->set(key + std::to_string(rank()), std::string(reinterpret_cast<const char*>(&mine), sizeof mine));
    std::vector<std::string> keys;
    for (int r = 0; r < size(); ++r) keys.push_back(key + std::to_string(r));
    store_->wait(keys, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
    std::vector<Fingerprint> all(static_cast<size_t>(size()));
    auto values = store_->multi_get(keys);
    for (int r = 0; r < size(); ++r) std::memcpy(&all[size_t(r)], values[size_t(r)].data(), sizeof(Fingerprint));
    std::string mismatch = fingerprint_mismatch(all);
    if (!mismatch.empty()) TINYDDP_FAIL(mismatch);
  }

  // The watchdog: completes works in order, and aborts on an asynchronous error or a timeout.
  void watch() {
    cudaSetDevice(device_);
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      wake_.wait_for(lock, std::chrono::milliseconds(1));
      while (!pending_.empty() && aborted_.empty()) {
        Pending& front = pending_.front();
        cudaError_t state = cudaEventQuery(front.done);
        if (state == cudaSuccess) {
          cudaEventDestroy(front.done);
          front.work->mark_succeeded();
          pending_.pop_front();
          continue;
        }
        ncclResult_t async = ncclSuccess;
        ncclCommGetAsyncError(comm_, &async);
        std::string reason;
        if (async != ncclSuccess && async != ncclInProgress)
          reason = front.work->description() + ": NCCL reported an asynchronous error: " + ncclGetErrorString(async) + " (" +
                   ncclGetLastError(comm_) + ")";
        else if (state != cudaErrorNotReady)
          reason = front.work->description() + ": CUDA error " + cudaGetErrorName(state);
        else if (Clock::now() > front.deadline)
          reason = front.work->description() + ": timed out";
        if (reason.empty()) break;
        lock.unlock();
        abort_all(reason);
        std::string named = culprits();
        lock.lock();
        for (Pending& p : pending_) {
          p.work->mark_failed(std::make_exception_ptr(
              Error("nccl backend: rank " + std::to_string(rank()) + ": " + reason + named +
                        "; hint: look at the named ranks' output; every rank must make the same calls",
                    "", __FILE__, __LINE__)));
          cudaEventDestroy(p.done);
        }
        pending_.clear();
      }
      if (pending_.empty()) drained_.notify_all();
    }
  }

  // Aborts the communicator (NCCL's kernels stop spinning) and tells the others why.
  void abort_all(const std::string& reason) {
    {
      std::lock_guard<std::mutex> state(mutex_);
      if (!aborted_.empty()) return;
      aborted_ = reason;
    }
    ncclCommAbort(comm_);
    comm_ = nullptr;
    try {
      store_->set(prefix_ + "aborted/" + std::to_string(rank()), reason);
    } catch (const std::exception&) {
      // The store's host may be the rank that died; the local error still stands.
    }
    drained_.notify_all();
  }

  // Names the other ranks: who reported a failure of its own, and who said nothing within a second
  // (those died, hang, or did not call the collective).
  std::string culprits() {
    std::vector<std::string> keys;
    for (int r = 0; r < size(); ++r) keys.push_back(prefix_ + "aborted/" + std::to_string(r));
    std::string silent, failed;
    try {
      auto until = Clock::now() + std::chrono::seconds(1);
      while (!store_->check(keys) && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      for (int r = 0; r < size(); ++r) {
        if (r == rank()) continue;
        (store_->check({keys[size_t(r)]}) ? failed : silent) += (std::string(", ") + std::to_string(r));
      }
    } catch (const std::exception&) {
      return "; the store is unreachable (its host, usually rank 0, may have died)";
    }
    std::string text;
    if (!silent.empty()) text += "; rank(s) " + silent.substr(2) + " reported nothing (died, hang, or never made this call)";
    if (!failed.empty()) text += "; rank(s) " + failed.substr(2) + " failed too";
    return text;
  }

  std::shared_ptr<Store> store_;
  ProcessGroupOptions options_;
  bool debug_detail_;
  int device_ = 0;
  std::string prefix_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t inputs_ready_ = nullptr;
  uint64_t sequence_ = 0;
  std::mutex launch_mutex_;  // launches in call order
  std::mutex mutex_;         // pending_, aborted_, stop_
  std::condition_variable wake_, drained_;
  std::deque<Pending> pending_;
  std::string aborted_;
  bool stop_ = false;
  std::thread watchdog_;
};

}  // namespace

std::shared_ptr<ProcessGroup> create_nccl_process_group(std::shared_ptr<Store> store, int rank, int size,
                                                        const ProcessGroupOptions& options) {
  return std::make_shared<NcclBackend>(std::move(store), rank, size, options);
}

}  // namespace tinyddp::comm
