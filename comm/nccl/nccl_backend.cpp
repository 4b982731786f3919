// The nccl backend: NVIDIA's collectives on CUDA tensors, behind the same ProcessGroup interface.
//
// What it adds around NCCL, and why:
//   - the rank's device: made current before the communicator is created (NCCL takes the calling
//     thread's current device), and every tensor checked against it before anything is queued;
//   - bootstrap: rank 0 makes the NCCL unique id and the store carries it to everyone;
//   - one communication stream per group, ordered after the compute stream with an event, so a
//     collective starts only when the kernels that produced its input have run, and compute
//     kernels launched meanwhile are not serialised behind the communication;
//   - completion: Work::wait() does not block the host: it makes the caller's stream (the device's
//     default stream, where compute is launched) wait for the collective's end event, as PyTorch's
//     ProcessGroupNCCL does, so the last bucket's all-reduce is followed by the optimizer's kernels
//     with no host round trip. A barrier, and Work::synchronize(), block the host: the thread then
//     polls the end event itself (Work's helper), yielding its core briefly, then sleeping a short,
//     fixed interval (Backoff). A watchdog thread completes the rest, polls ncclCommGetAsyncError,
//     and calls ncclCommAbort on a timeout or an asynchronous error (a dead peer), so no rank hangs:
//     NCCL's own kernels would otherwise spin forever;
//   - failure naming: an aborting rank writes its reason in the store; the others read them and
//     name the ranks that reported nothing (dead, hung, or not calling this collective);
//   - grouped launches (ncclGroupStart/End) for all_reduce_coalesced, the group closed however the
//     enqueue ends (GroupScope);
//   - teardown by NCCL's protocol: ncclCommFinalize, poll until the communicator is quiescent, then
//     ncclCommDestroy; ncclCommAbort when that fails or takes longer than the timeout;
//   - launch order across groups: each group has its own stream, so two groups on one device (DDP's
//     and ZeRO's) need the same launch order on every rank, or NCCL_LAUNCH_ORDER_IMPLICIT (NCCL 2.26+,
//     set by the NCCL half unless the user set it: comm/nccl/plugin/nccl_library.cpp);
//   - the DETAIL fingerprint check through the store;
//   - the flight recorder (flight_recorder.h), as in the host backend: queued when called, started
//     when handed to NCCL on the stream, finished when its end event fires; written on a failure and
//     on SIGUSR1 (the watchdog thread writes it), and the source of time_in_collectives. On a GPU
//     "started" to "finished" also covers the time the collective waited on the stream behind
//     earlier ones.
//
// The communicator is non-blocking (config.blocking = 0): every call returns at once (ncclInProgress
// while NCCL finishes it on a thread of its own), so no thread of this process is ever stuck inside
// NCCL. A rank that never arrives -- at init, or at a collective's first connection -- or that dies,
// is met by polling against a deadline, and ncclCommAbort then runs while no other call is inside
// the communicator. A blocking communicator would save the thread NCCL 2.28 starts for each ncclGroupEnd
// of a non-blocking one (a small part of a launch), but a thread blocked inside NCCL cannot be freed safely:
// aborting a communicator that another thread is inside frees it under that thread. So the launch
// polls for the call's completion yielding first (it usually completes within tens of
// microseconds), then sleeping a short, fixed interval.
//
// NCCL allows one thread at a time per communicator, ncclCommGetAsyncError included: every call on
// comm_, from a launching thread or from the watchdog, is made under nccl_mutex_.
// Lock order: launch_mutex_, then nccl_mutex_, then state_mutex_.
#include "tinyddp/comm/nccl/nccl_backend.h"

#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "tinyddp/comm/fingerprint.h"
#include "tinyddp/comm/flight_recorder.h"
#include "tinyddp/comm/nccl/nccl_api.h"
#include "tinyddp/comm/store/rendezvous.h"
#include "tinyddp/core/cuda_runtime.h"
#include "tinyddp/core/log.h"

namespace tinyddp::comm {

namespace {

using Clock = std::chrono::steady_clock;

// Waits between polls of a host that must block: yields the core for the first kYield (a launch is
// usually taken in by then, and a small collective done), then sleeps kSleep at a time. The sleep
// does not grow: a doubling sleep (up to 1 ms, as this was) noticed the end of a long wait up to
// about twice late, and the last bucket of every step is such a wait. A sleep of 20 us costs a
// thread about 1/50 of a core (Linux's default timer slack makes it about 70 us).
class Backoff {
 public:
  static constexpr auto kYield = std::chrono::microseconds(100);
  static constexpr auto kSleep = std::chrono::microseconds(20);
  void wait() {
    if (Clock::now() - start_ < kYield)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(kSleep);
  }

 private:
  Clock::time_point start_ = Clock::now();
};

// How long a failure waits for the aborted kernels to stop before it keeps their buffers for good
// (release_after_abort); at most the group's timeout.
constexpr std::chrono::milliseconds kAbortDrainBound{10000};

bool accepted(NcclResult r) { return r == NcclResult::success || r == NcclResult::in_progress; }

void* ptr(const Tensor& t) { return const_cast<void*>(t.raw_data()); }

// ncclGroupStart now; ncclGroupEnd at end(), or in the destructor when an exception leaves the scope
// first. A group left open would make NCCL hold back every later call of this thread.
class GroupScope {
 public:
  explicit GroupScope(NcclApi& nccl) : nccl_(nccl), started_(nccl.group_start()) {}
  ~GroupScope() {
    if (accepted(started_) && !ended_) nccl_.group_end();
  }
  GroupScope(const GroupScope&) = delete;
  GroupScope& operator=(const GroupScope&) = delete;
  NcclResult started() const { return started_; }
  NcclResult end() {
    ended_ = true;
    return nccl_.group_end();
  }

 private:
  NcclApi& nccl_;
  NcclResult started_;
  bool ended_ = false;
};

int local_rank_from_environment() {
  try {
    return read_launch_environment().local_rank;
  } catch (const std::exception&) {
    return -1;  // inconsistent launcher variables: the rank decides (rendezvous reports the rest)
  }
}

class NcclBackend final : public ProcessGroup {
 public:
  NcclBackend(std::shared_ptr<Store> store, int rank, int size, const ProcessGroupOptions& options, NcclApi& nccl,
              CudaApi& cuda);
  ~NcclBackend() override;

  std::string backend() const override { return "nccl"; }
  WorkPtr all_reduce(const Tensor& t, ReduceOp op, const CallOptions& call) override;
  WorkPtr all_reduce_into(const Tensor& out, const Tensor& in, ReduceOp op, const CallOptions& call) override;
  WorkPtr all_reduce_coalesced(const std::vector<Tensor>& tensors, ReduceOp op, const CallOptions& call) override;
  WorkPtr broadcast(const Tensor& t, int root, const CallOptions& call) override;
  WorkPtr all_gather(const Tensor& out, const Tensor& in, const CallOptions& call) override;
  WorkPtr reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op, const CallOptions& call) override;
  WorkPtr barrier(const CallOptions& call) override;
  CollectiveTime time_in_collectives() const override {
    auto t = recorder_.totals();
    return {t.collectives, t.seconds};
  }

 private:
  struct Pending {
    WorkPtr work;
    uint64_t sequence = 0;  // the flight recorder's
    CudaEvent done;
    Clock::time_point deadline;
    std::chrono::milliseconds timeout;  // for the message when the deadline passes
    std::vector<Tensor> keep_alive;     // the caching allocator must not reuse them while NCCL runs
    bool blocks_host = false;           // wait() blocks the host (a barrier), not only the stream
  };
  using Enqueue = std::function<NcclResult(NcclComm, CudaStream)>;

  // Work's helper: a waiting thread completes its collective itself instead of waiting for the watchdog.
  class Completer : public Work::Helper {
   public:
    explicit Completer(NcclBackend& backend) : backend_(backend) {}
    void help(Work& target) override { backend_.help(target); }
    bool order_after(Work& target) override { return backend_.order_after(target); }

   private:
    NcclBackend& backend_;
  };

  void bootstrap(NcclUniqueId& id);
  void warn_about_other_contexts() const;
  void check_device(const Tensor& t, const char* collective) const;
  WorkPtr launch(Fingerprint f, const CallOptions& call, std::vector<Tensor> tensors, const Enqueue& enqueue,
                 bool blocks_host = false);
  void check_locked(NcclResult result, const std::string& what);
  void settle_locked(NcclResult issued, Clock::time_point deadline, const std::string& what);
  [[noreturn]] void fail_locked(const std::string& reason, const char* advice);
  void abort_locked(const std::string& reason);
  void check_fingerprints(const Fingerprint& mine, Clock::time_point deadline);
  bool complete_finished();
  void help(Work& target);
  bool order_after(Work& target);
  void watch();
  void check_oldest();
  void fail_pending(const std::string& reason, bool timed_out);
  void release_after_abort(std::deque<Pending>& failed);
  std::string record_failure(const std::string& reason, bool timed_out);
  std::string culprits();
  void teardown();
  CudaEvent take_event();

  std::shared_ptr<Store> store_;
  ProcessGroupOptions options_;
  bool debug_detail_;
  CudaApi& cuda_;
  NcclApi& nccl_;
  int device_ = 0;
  std::string prefix_;
  NcclComm comm_ = nullptr;  // under nccl_mutex_; null once aborted or destroyed
  CudaStream stream_ = nullptr;
  CudaEvent inputs_ready_ = nullptr;
  uint64_t sequence_ = 0;
  std::mutex launch_mutex_;  // launches in call order
  std::mutex nccl_mutex_;    // every NCCL call on comm_, and comm_ itself
  std::mutex state_mutex_;   // pending_, free_events_, aborted_, helpers_, stop_
  std::condition_variable wake_, drained_;
  std::deque<Pending> pending_;
  std::vector<CudaEvent> free_events_;
  std::string aborted_;
  int helpers_ = 0;
  bool stop_ = false;
  std::shared_ptr<Completer> completer_;
  FlightRecorder recorder_;
  uint64_t dumps_served_ = FlightRecorder::dump_requests();  // SIGUSR1s already answered
  std::thread watchdog_;
};

NcclBackend::NcclBackend(std::shared_ptr<Store> store, int rank, int size, const ProcessGroupOptions& options,
                         NcclApi& nccl, CudaApi& cuda)
    : ProcessGroup(rank, size),
      store_(std::move(store)),
      options_(options),
      debug_detail_(options.debug_detail.value_or(debug_detail_from_environment())),
      cuda_(cuda),
      nccl_(nccl),
      recorder_(rank, size, options.group_name, FlightRecorder::capacity_from_environment()) {
  TINYDDP_CHECK(store_ != nullptr, "nccl backend: no store was given", hint("pass the TcpStore the ranks share"));
  TINYDDP_CHECK(size >= 1 && rank >= 0 && rank < size, "nccl backend: rank ", rank, " of world size ", size,
                " is impossible", hint("ranks go from 0 to world size - 1"));
  device_ = options.device >= 0 ? options.device
                                : default_cuda_device(local_rank_from_environment(), rank, cuda_device_count(),
                                                      cuda_visible_devices_restricted());
  require_device(Device::cuda(device_));
  cuda_.set_device(device_);  // NCCL's device is the calling thread's current one
  warn_about_other_contexts();

  NcclUniqueId id;
  bootstrap(id);
  {
    std::lock_guard<std::mutex> lock(nccl_mutex_);
    NcclResult issued = nccl_.comm_init_rank(&comm_, size, id, rank, /*blocking=*/false);
    settle_locked(issued, Clock::now() + options.timeout, "ncclCommInitRankConfig");
  }
  try {
    stream_ = cuda_.create_stream(device_);
    inputs_ready_ = cuda_.create_event(device_);
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lock(nccl_mutex_);
    abort_locked(std::string("setting up the communication stream failed: ") + e.what());
    throw;
  }
  completer_ = std::make_shared<Completer>(*this);
  if (!FlightRecorder::directory().empty()) FlightRecorder::install_dump_signal();
  watchdog_ = std::thread([this] { watch(); });
}

// Rank 0 makes the unique id; the store carries it to everyone. Every rank's n-th group of a name
// meets the others' n-th one, even on a reused store.
void NcclBackend::bootstrap(NcclUniqueId& id) {
  const std::string base = "tinyddp/nccl/" + options_.group_name + "/";
  const int64_t generation = store_->add(base + "generation/" + std::to_string(rank()), 1);
  prefix_ = base + std::to_string(generation) + "/";
  if (rank() == 0) {
    NcclResult made = nccl_.get_unique_id(&id);
    TINYDDP_CHECK(made == NcclResult::success, "nccl backend: ncclGetUniqueId failed: ", nccl_.error_string(made), " (",
                  nccl_.last_error(nullptr), ")", hint("NCCL_DEBUG=WARN shows NCCL's own log"));
    store_->set(prefix_ + "unique_id", std::string(id.data(), id.size()));
  }
  store_->wait({prefix_ + "unique_id"}, options_.timeout);
  std::string bytes = store_->get(prefix_ + "unique_id");
  TINYDDP_CHECK(bytes.size() == id.size(), "nccl backend: the unique id in the store has ", bytes.size(),
                " bytes, not ", id.size(), hint("every rank must run the same build of tinyddp and NCCL"));
  std::memcpy(id.data(), bytes.data(), id.size());
}

// A context on another device in this process costs that device hundreds of MB, and is refused in
// exclusive-process mode: say so, once, naming the devices. (Fake devices enforce the rule themselves,
// and tests that run ranks as threads of one process turn it off there.)
void NcclBackend::warn_about_other_contexts() const {
  if (cuda_devices_are_fake()) return;
  std::string others;
  for (int device : cuda_devices_with_context())
    if (device != device_) others += (others.empty() ? "cuda:" : ", cuda:") + std::to_string(device);
  if (!others.empty())
    log_line(LogLevel::warn, "nccl",
             "rank " + std::to_string(rank()) + " uses cuda:" + std::to_string(device_) +
                 ", but this process also has a CUDA context on " + others +
                 "; something touched that device (a tensor moved "
                 "there, a thread that never selected a device): each rank should touch its own device only");
}

NcclBackend::~NcclBackend() {
  {
    std::unique_lock<std::mutex> lock(state_mutex_);
    // Let the issued collectives finish (bounded by their own deadlines: the watchdog aborts then),
    // and the threads helping inside help() leave it.
    drained_.wait(lock, [&] { return (pending_.empty() || !aborted_.empty()) && helpers_ == 0; });
    stop_ = true;
  }
  wake_.notify_all();
  watchdog_.join();
  teardown();
  try {
    for (CudaEvent e : free_events_) cuda_.destroy_event(e);
    if (inputs_ready_) cuda_.destroy_event(inputs_ready_);
    if (stream_) cuda_.destroy_stream(stream_);
  } catch (const std::exception& e) {
    log_line(LogLevel::warn, "nccl", std::string("releasing the communication stream: ") + e.what());
  }
}

// NCCL's protocol: finalize (the communicator flushes and waits until every rank is done with it),
// poll until it is quiescent, destroy. Abort when any step fails or outlasts the timeout.
void NcclBackend::teardown() {
  std::lock_guard<std::mutex> lock(nccl_mutex_);
  if (comm_ == nullptr) return;  // aborted already
  const auto deadline = Clock::now() + options_.timeout;
  NcclResult state = nccl_.comm_finalize(comm_);
  for (Backoff backoff; state == NcclResult::in_progress || state == NcclResult::success;) {
    NcclResult now = NcclResult::success;
    if (nccl_.comm_get_async_error(comm_, &now) != NcclResult::success) break;
    state = now;
    if (state != NcclResult::in_progress || Clock::now() > deadline) break;
    backoff.wait();
  }
  std::string problem;
  if (state == NcclResult::success) {
    NcclResult destroyed = nccl_.comm_destroy(comm_);
    if (destroyed == NcclResult::success) {
      comm_ = nullptr;
      return;
    }
    problem = "ncclCommDestroy failed: " + nccl_.error_string(destroyed);
  } else {
    problem = state == NcclResult::in_progress ? "ncclCommFinalize did not finish within the timeout"
                                               : "ncclCommFinalize failed: " + nccl_.error_string(state);
  }
  log_line(LogLevel::warn, "nccl",
           "rank " + std::to_string(rank()) + ": " + problem + " (" + nccl_.last_error(comm_) +
               "); aborting the communicator instead");
  nccl_.comm_abort(comm_);
  comm_ = nullptr;
}

void NcclBackend::check_device(const Tensor& t, const char* collective) const {
  TINYDDP_CHECK(t.device() == Device::cuda(device_), "nccl backend: ", collective, ": ", t.describe(),
                " is not on this rank's device cuda:", device_,
                " (NCCL reads and writes only its communicator's device)",
                hint("move it with .to(Device::cuda(", device_, ")), or use the host backend for CPU tensors"));
}

WorkPtr NcclBackend::launch(Fingerprint f, const CallOptions& call, std::vector<Tensor> tensors, const Enqueue& enqueue,
                            bool blocks_host) {
  const char* name = collective_kind_name(CollectiveKind(f.kind));
  for (const Tensor& t : tensors) check_device(t, name);
  std::unique_lock<std::mutex> launching(launch_mutex_);
  {
    std::lock_guard<std::mutex> state(state_mutex_);
    TINYDDP_CHECK(aborted_.empty(), "nccl backend: rank ", rank(), " cannot launch ", name,
                  ": the group was aborted by an earlier failure: ", aborted_,
                  hint("handle that failure, then create a new process group on every rank"));
  }
  f.sequence = sequence_++;
  const auto timeout = call.timeout.count() > 0 ? call.timeout : options_.timeout;
  const auto deadline = Clock::now() + timeout;
  if (debug_detail_ && size() > 1) check_fingerprints(f, deadline);
  auto work = std::make_shared<Work>(f);
  work->set_helper(completer_, tuning::kWorkWaitSpin);
  recorder_.queued(f, call.bucket);  // the GPU runs the collective: no host core to give away

  // The collective waits for the compute (legacy default) stream's work so far, not the reverse.
  cuda_.set_device(device_);
  cuda_.record_event(inputs_ready_, nullptr);
  cuda_.stream_wait_event(stream_, inputs_ready_);
  {
    std::lock_guard<std::mutex> lock(nccl_mutex_);
    TINYDDP_CHECK(comm_ != nullptr, "nccl backend: rank ", rank(), ": the communicator was aborted",
                  hint("create a new "
                       "process group on every rank"));
    NcclResult queued = NcclResult::success, issued = NcclResult::success;
    {
      GroupScope group(nccl_);
      queued = accepted(group.started()) ? enqueue(comm_, stream_) : group.started();
      issued = group.end();
    }
    // No NCCL call may run inside an open group (ncclCommAbort included), so results are judged here.
    try {
      check_locked(queued, work->description());
      settle_locked(issued, deadline, work->description());
    } catch (const Error& e) {
      recorder_.finished(f.sequence, false);
      throw Error(e.message() + record_failure(e.message(), Clock::now() > deadline), "", __FILE__, __LINE__);
    }
  }
  recorder_.started(f.sequence);
  CudaEvent done = take_event();
  cuda_.record_event(done, stream_);
  {
    std::lock_guard<std::mutex> state(state_mutex_);
    pending_.push_back({work, f.sequence, done, deadline, timeout, std::move(tensors), blocks_host});
  }
  // The watchdog is not woken: it looks every millisecond anyway, and a wake-up per launch would bring
  // it onto the communicator's mutex and the CUDA driver just when the next launch needs them.
  launching.unlock();
  if (call.blocking) work->wait();
  return work;
}

void NcclBackend::check_locked(NcclResult result, const std::string& what) {
  if (accepted(result)) return;
  fail_locked(what + ": NCCL failed: " + nccl_.error_string(result) + " (" + nccl_.last_error(comm_) + ")",
              "NCCL_DEBUG=WARN shows NCCL's own log");
}

// A non-blocking communicator answers in_progress until the call has been taken in.
void NcclBackend::settle_locked(NcclResult issued, Clock::time_point deadline, const std::string& what) {
  check_locked(issued, what);
  for (Backoff backoff;; backoff.wait()) {
    NcclResult state = NcclResult::success;
    check_locked(nccl_.comm_get_async_error(comm_, &state), what + ": ncclCommGetAsyncError");
    if (state == NcclResult::success) return;
    if (state != NcclResult::in_progress)
      fail_locked(what + ": NCCL failed: " + nccl_.error_string(state) + " (" + nccl_.last_error(comm_) + ")",
                  "NCCL_DEBUG=WARN shows NCCL's own log");
    if (Clock::now() > deadline)
      fail_locked(what + ": timed out after " + std::to_string(options_.timeout.count()) + " ms",
                  "every rank must make the same calls; raise the timeout if the job is just slow");
  }
}

void NcclBackend::fail_locked(const std::string& reason, const char* advice) {
  abort_locked(reason);
  TINYDDP_FAIL("nccl backend: rank ", rank(), ": ", reason, culprits(), hint(advice));
}

// Aborts the communicator (NCCL's kernels stop spinning) and tells the others why.
void NcclBackend::abort_locked(const std::string& reason) {
  if (comm_ != nullptr) {
    nccl_.comm_abort(comm_);
    comm_ = nullptr;
  }
  {
    std::lock_guard<std::mutex> state(state_mutex_);
    if (aborted_.empty()) aborted_ = reason;
  }
  drained_.notify_all();
  try {
    store_->set(prefix_ + "aborted/" + std::to_string(rank()), reason);
  } catch (const std::exception&) {
    // The store's host may be the rank that died; the local error still stands.
  }
}

void NcclBackend::check_fingerprints(const Fingerprint& mine, Clock::time_point deadline) {
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

CudaEvent NcclBackend::take_event() {
  {
    std::lock_guard<std::mutex> state(state_mutex_);
    if (!free_events_.empty()) {
      CudaEvent e = free_events_.back();
      free_events_.pop_back();
      return e;
    }
  }
  return cuda_.create_event(device_);
}

// Completes, in order, the collectives whose end event has fired. True if any did.
bool NcclBackend::complete_finished() {
  bool any = false;
  std::lock_guard<std::mutex> state(state_mutex_);
  while (!pending_.empty() && aborted_.empty() &&
         cuda_.query_event(pending_.front().done, nullptr) == CudaEventState::done) {
    free_events_.push_back(pending_.front().done);
    recorder_.finished(pending_.front().sequence, true);
    pending_.front().work->mark_succeeded();
    pending_.pop_front();
    any = true;
  }
  if (pending_.empty()) drained_.notify_all();
  return any;
}

// Work::wait(): the caller's stream -- the device's legacy default stream, where tinyddp launches its
// kernels and its device-to-host copies -- waits for the collective's end event; the host does not.
// Under state_mutex_, so the event is not handed to a later collective (complete_finished) while the
// wait is queued: cudaStreamWaitEvent waits for the event's record at the time of the call.
bool NcclBackend::order_after(Work& target) {
  std::lock_guard<std::mutex> state(state_mutex_);
  if (!aborted_.empty() || stop_) return false;  // the host waits for the failure to be said
  for (const Pending& p : pending_) {
    if (p.work.get() != &target) continue;
    if (p.blocks_host) return false;
    cuda_.set_device(device_);
    cuda_.stream_wait_event(nullptr, p.done);
    return true;
  }
  return false;  // finished already: nothing to order after
}

void NcclBackend::help(Work& target) {
  {
    std::lock_guard<std::mutex> state(state_mutex_);
    if (stop_) return;
    ++helpers_;
  }
  for (Backoff backoff; !target.is_completed(); backoff.wait()) {
    complete_finished();
    std::lock_guard<std::mutex> state(state_mutex_);
    if (!aborted_.empty()) break;  // the watchdog fails the pending works
  }
  std::lock_guard<std::mutex> state(state_mutex_);
  --helpers_;
  drained_.notify_all();
}

// The watchdog: completes what nobody waits for, and aborts on an error or a timeout.
void NcclBackend::watch() {
  try {
    cuda_.set_device(device_);
  } catch (const std::exception& e) {
    log_line(LogLevel::warn, "nccl", std::string("watchdog: ") + e.what());
  }
  std::unique_lock<std::mutex> lock(state_mutex_);
  while (!stop_) {
    wake_.wait_for(lock, std::chrono::milliseconds(1));
    if (FlightRecorder::dump_requests() != dumps_served_) {
      dumps_served_ = FlightRecorder::dump_requests();
      std::string path = recorder_.dump("SIGUSR1");
      if (!path.empty())
        log_line(LogLevel::info, "flight recorder", "rank " + std::to_string(rank()) + ": wrote " + path);
    }
    if (pending_.empty() || !aborted_.empty()) continue;
    lock.unlock();
    complete_finished();
    check_oldest();
    lock.lock();
  }
}

// Looks at the oldest pending collective: a CUDA error, its deadline passed, or NCCL's asynchronous
// error fails every pending one.
void NcclBackend::check_oldest() {
  std::string reason, described;
  bool timed_out = false;
  {
    std::lock_guard<std::mutex> state(state_mutex_);
    if (pending_.empty() || !aborted_.empty()) return;
    Pending& front = pending_.front();
    described = front.work->description();
    std::string error;
    if (cuda_.query_event(front.done, &error) == CudaEventState::failed)
      reason = described + ": CUDA error " + error;
    else if (Clock::now() > front.deadline)
      reason = described + ": not finished after " + std::to_string(front.timeout.count()) +
               " ms (its end event on cuda:" + std::to_string(device_) + " never fired)",
      timed_out = true;
  }
  if (reason.empty()) {
    std::lock_guard<std::mutex> lock(nccl_mutex_);
    NcclResult async = NcclResult::success;
    if (comm_ != nullptr && nccl_.comm_get_async_error(comm_, &async) == NcclResult::success && !accepted(async))
      reason = described + ": NCCL reported an asynchronous error: " + nccl_.error_string(async) + " (" +
               nccl_.last_error(comm_) + ")";
  }
  if (!reason.empty()) fail_pending(reason, timed_out);
}

// Writes the flight record of a failure; returns " (flight record: PATH)", or "" when none is kept.
std::string NcclBackend::record_failure(const std::string& reason, bool timed_out) {
  recorder_.set_error(reason);
  const std::string path = recorder_.dump(timed_out ? "timeout" : "error");
  return path.empty() ? "" : " (flight record: " + path + ")";
}

void NcclBackend::fail_pending(const std::string& reason, bool timed_out) {
  {
    std::lock_guard<std::mutex> lock(nccl_mutex_);
    abort_locked(reason);
  }
  const std::string named = culprits();
  std::deque<Pending> failed;
  {
    std::lock_guard<std::mutex> state(state_mutex_);
    failed.swap(pending_);
  }
  for (Pending& p : failed) recorder_.finished(p.sequence, false);
  const std::string record = record_failure(reason + named, timed_out);
  for (Pending& p : failed)
    p.work->mark_failed(std::make_exception_ptr(
        Error("nccl backend: rank " + std::to_string(rank()) + ": " + reason + named + record,
              hint("look at the named ranks' output; every rank must make the same calls"), "", __FILE__, __LINE__)));
  release_after_abort(failed);
  drained_.notify_all();
}

// ncclCommAbort tells the communicator's kernels to stop, but they stop when they next look, and
// collectives queued behind other work on the stream start (and stop) later still. Until then they
// may read and write their buffers: those go back to the caching allocator -- where the next tensor
// would get them -- only once the stream has passed the last collective's end event. If it does not
// within the bound (a device that no longer runs anything), the buffers are kept until exit instead.
void NcclBackend::release_after_abort(std::deque<Pending>& failed) {
  if (failed.empty()) return;
  const auto bound = std::min<std::chrono::milliseconds>(options_.timeout, kAbortDrainBound);
  const auto until = Clock::now() + bound;
  bool stopped = false;
  try {
    for (Backoff backoff; Clock::now() < until; backoff.wait())
      if (cuda_.query_event(failed.back().done, nullptr) != CudaEventState::pending) {
        stopped = true;  // done, or the device failed (nothing runs on it any more)
        break;
      }
  } catch (const std::exception&) {
    stopped = true;  // the device is gone: nothing of it runs
  }
  for (Pending& p : failed) {
    try {
      cuda_.destroy_event(p.done);
    } catch (const std::exception&) {
      // The device is in an error state; the event goes with the context.
    }
    if (!stopped) {
      static std::mutex kept_mutex;
      static auto* kept = new std::vector<Tensor>;  // never freed: the kernels may still use them
      std::lock_guard<std::mutex> lock(kept_mutex);
      kept->insert(kept->end(), p.keep_alive.begin(), p.keep_alive.end());
    }
  }
  if (!stopped)
    log_line(LogLevel::warn, "nccl",
             "rank " + std::to_string(rank()) + ": the aborted collectives' kernels did not stop within " +
                 std::to_string(bound.count()) + " ms; their " + std::to_string(failed.size()) +
                 " collective(s)' buffers are kept until the process exits, so no new tensor gets memory they "
                 "may still write");
  failed.clear();
}

// Names the other ranks: who reported a failure of its own, and who said nothing within a second
// (those died, hang, or did not call the collective).
std::string NcclBackend::culprits() {
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
  if (!silent.empty())
    text += "; rank(s) " + silent.substr(2) + " reported nothing (died, hang, or never made this call)";
  if (!failed.empty()) text += "; rank(s) " + failed.substr(2) + " failed too";
  return text;
}

// ---- the collectives ----

WorkPtr NcclBackend::all_reduce(const Tensor& t, ReduceOp op, const CallOptions& call) {
  check_tensor(t, "all_reduce", "tensor");
  return launch(make_fingerprint(CollectiveKind::all_reduce, t, t.numel(), op), call, {t},
                [=, this](NcclComm c, CudaStream s) {
                  return nccl_.all_reduce(ptr(t), ptr(t), size_t(t.numel()), t.dtype(), op, c, s);
                });
}

WorkPtr NcclBackend::all_reduce_into(const Tensor& out, const Tensor& in, ReduceOp op, const CallOptions& call) {
  check_tensor(out, "all_reduce_into", "output");
  check_tensor(in, "all_reduce_into", "input");
  check_same(out, in, "all_reduce_into");
  return launch(make_fingerprint(CollectiveKind::all_reduce, in, in.numel(), op), call, {out, in},
                [=, this](NcclComm c, CudaStream s) {
                  return nccl_.all_reduce(ptr(in), ptr(out), size_t(in.numel()), in.dtype(), op, c, s);
                });
}

WorkPtr NcclBackend::all_reduce_coalesced(const std::vector<Tensor>& tensors, ReduceOp op, const CallOptions& call) {
  TINYDDP_CHECK(!tensors.empty(), "all_reduce_coalesced: no tensors were given", hint("pass at least one tensor"));
  int64_t total = 0;
  for (const Tensor& t : tensors) {
    check_tensor(t, "all_reduce_coalesced", "tensor");
    total += t.numel();
  }
  // One launch for all of them: inside ncclGroupStart/End NCCL fuses the operations.
  return launch(make_fingerprint(CollectiveKind::all_reduce, tensors[0], total, op), call, tensors,
                [=, this](NcclComm c, CudaStream s) {
                  for (const Tensor& t : tensors) {
                    NcclResult r = nccl_.all_reduce(ptr(t), ptr(t), size_t(t.numel()), t.dtype(), op, c, s);
                    if (!accepted(r)) return r;
                  }
                  return NcclResult::success;
                });
}

WorkPtr NcclBackend::broadcast(const Tensor& t, int root, const CallOptions& call) {
  check_tensor(t, "broadcast", "tensor");
  check_root(root, "broadcast");
  return launch(make_fingerprint(CollectiveKind::broadcast, t, t.numel(), std::nullopt, root), call, {t},
                [=, this](NcclComm c, CudaStream s) {
                  return nccl_.broadcast(ptr(t), ptr(t), size_t(t.numel()), t.dtype(), root, c, s);
                });
}

WorkPtr NcclBackend::all_gather(const Tensor& out, const Tensor& in, const CallOptions& call) {
  check_tensor(out, "all_gather", "output");
  check_tensor(in, "all_gather", "input");
  TINYDDP_CHECK(out.dtype() == in.dtype() && out.numel() == in.numel() * size(), "all_gather: output ", out.describe(),
                " must hold world size (", size(), ") x input ", in.describe(), hint("size the output accordingly"));
  return launch(make_fingerprint(CollectiveKind::all_gather, in, in.numel(), std::nullopt), call, {out, in},
                [=, this](NcclComm c, CudaStream s) {
                  return nccl_.all_gather(ptr(in), ptr(out), size_t(in.numel()), in.dtype(), c, s);
                });
}

WorkPtr NcclBackend::reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op, const CallOptions& call) {
  check_tensor(out, "reduce_scatter", "output");
  check_tensor(in, "reduce_scatter", "input");
  TINYDDP_CHECK(out.dtype() == in.dtype() && in.numel() == out.numel() * size(), "reduce_scatter: input ",
                in.describe(), " must hold world size (", size(), ") x output ", out.describe(),
                hint("size the input accordingly"));
  return launch(make_fingerprint(CollectiveKind::reduce_scatter, out, out.numel(), op), call, {out, in},
                [=, this](NcclComm c, CudaStream s) {
                  return nccl_.reduce_scatter(ptr(in), ptr(out), size_t(out.numel()), in.dtype(), op, c, s);
                });
}

WorkPtr NcclBackend::barrier(const CallOptions& call) {
  // A one-element all-reduce on the device; the Work completes when every rank has joined.
  Tensor token = Tensor::zeros({1}, DType::i32, Device::cuda(device_));
  return launch(
      make_fingerprint(CollectiveKind::barrier, Tensor(), 0, std::nullopt), call, {token},
      [=, this](NcclComm c, CudaStream s) {
        return nccl_.all_reduce(ptr(token), ptr(token), 1, DType::i32, ReduceOp::sum, c, s);
      },
      /*blocks_host=*/true);
}

}  // namespace

std::shared_ptr<ProcessGroup> create_nccl_process_group(std::shared_ptr<Store> store, int rank, int size,
                                                        const ProcessGroupOptions& options) {
  NcclApi& nccl = nccl_api();  // first: "not in this build" and "no GPU" are said before anything else
  return std::make_shared<NcclBackend>(std::move(store), rank, size, options, nccl, cuda_api());
}

}  // namespace tinyddp::comm
