#include "comm/ring_backend.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <thread>

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include "comm/algorithms/small_message_allreduce.h"
#include "comm/store/prefix_store.h"
#include "comm/store/tcp_store.h"
#include "comm/transport/shm_transport.h"
#include "comm/transport/tcp_transport.h"

namespace tinyddp::comm {

namespace {

// All-reduces of at most this many bytes use the direct exchange instead of the ring. Measured
// with bench/allreduce_perf on the 2-core reference host (2 ranks): over shm the direct exchange
// is faster up to 16-32 KiB and the ring from 64 KiB; over tcp the crossover is the same within
// noise. 4 ranks keep the same crossover: the direct exchange sends 3x the bytes there, but the
// ring's 6 dependent steps cost more than that below ~32 KiB.
constexpr size_t kSmallMessageBytes = 32 << 10;
// Two ranks over tcp: there the direct exchange moves the same bytes as the ring (each rank sends
// its whole buffer once either way) in one step instead of two dependent ones, and loopback TCP
// rewards the one long duplex transfer. Measured side by side (3 runs, alternating, 2-core host,
// in-place us, direct against ring): 128 KiB 64-111 against 100-160, 256 KiB 113-172 against
// 151-159, 512 KiB 221-279 against 217-229, 1 MiB 410-427 against 385-449, 2 MiB 976-1169 against
// 620-804. (Before tcp's 1 MiB turns, Connection::segment_bytes, the ring lost up to 4 MiB.) Over
// shm, and with more ranks (the direct exchange sends n-1 times the bytes), the ring wins from
// 32-64 KiB.
constexpr size_t kSmallMessageBytesTcpPair = 512 << 10;
// Collectives up to this size may run on a blocking caller's own thread (see Executor): above it
// the hand-off is small beside the transfer, and an unawaited collective must not wait to start.
constexpr size_t kBlockingCallerBytes = 64 << 10;
// The spin budget when ranks outnumber cores. Every retry then yields the core (see the Waiter in
// ring_algorithms.cpp), so the rank being waited for gets to run; sleeping on the futex instead
// costs a wake-up per hand-off. 4 ranks on 2 cores, shm, 1 MiB: 9 GB/s busbw with 500 us of
// yielding spin, 4 GB/s with 50 us, 2 GB/s with 2 us (one run, side by side).
constexpr auto kOversubscribedSpin = std::chrono::microseconds(500);

// A DETAIL mismatch: every rank raises it together and the streams stay in step, so unlike a
// transport failure it does not abort the group.
class MismatchError : public Error {
 public:
  using Error::Error;
};

void bind_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

// The CPU for the communication thread of the local_index-th of local_count ranks on this host, or
// -1 for none. Ranks that exchange through memory wake each other constantly, and the scheduler
// likes to wake a thread on the CPU of the thread that woke it: left alone, two ranks end up
// taking turns on one core while the other idles. One core each (what mpirun's default binding
// does) stops that. Only when every rank gets a core of its own; TINYDDP_BIND=none turns it off.
// The CPUs come from this process's allowed set, so a launcher's own binding is respected.
int pick_cpu(int local_index, int local_count) {
  const char* bind = std::getenv("TINYDDP_BIND");
  if (bind && std::string(bind) == "none") return -1;
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return -1;
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  if (local_count < 2 || int(cpus.size()) < local_count) return -1;
  return cpus[size_t(local_index) % cpus.size()];
}

size_t env_size(const char* name, size_t fallback) {
  const char* value = std::getenv(name);
  return value && *value ? size_t(std::stoull(value)) : fallback;
}

// The host memory a collective works on: the tensor itself when it is on the CPU (not even a copy
// of the Tensor handle, which allocates its shape); else a host copy, made in `staging`.
const Tensor& host_input(const Tensor& t, Tensor& staging) {
  if (t.device().is_cpu()) return t;
  staging = t.to(Device::cpu());
  return staging;
}

// The same for a result: a CUDA tensor gets a host buffer in `staging`, written back afterwards.
const Tensor& host_output(const Tensor& t, Tensor& staging) {
  if (t.device().is_cpu()) return t;
  staging = Tensor::empty(t.shape(), t.dtype());
  return staging;
}

// Copies a staged host result back into a CUDA tensor (a no-op for CPU tensors).
void write_back(const Tensor& original, const Tensor& host) {
  if (original.device().is_cpu()) return;
  Tensor target = original;
  target.copy_from(host);
}

std::byte* bytes_of(const Tensor& t) { return static_cast<std::byte*>(const_cast<void*>(t.raw_data())); }

}  // namespace

// ---- the communication thread and the queue it drains ----
//
// One runner at a time, claimed under the queue's mutex: the communication thread, or a caller
// waiting on a collective nobody has started (Work's helper). Ownership changes hands through the
// claim flag, never by blocking on a lock, because on a busy 2-core host every blocked-then-woken
// hand-off costs tens of microseconds.
//
// Two ways to start a collective, chosen per call from what the caller did before:
//   - eager (the default): enqueue wakes the communication thread at once, so the collective runs
//     while the caller goes on computing (DDP's bucket all-reduces behind the backward pass).
//   - a blocking caller's: when the last few collectives were small and each was waited for before
//     the next was called (a loss averaged every step, a barrier, an MPI-style loop), enqueue does
//     not wake the thread: the caller is about to wait, and then runs the collective itself on its
//     own core. A wake-up, and the core the woken thread takes from the caller, cost 15-30 us on
//     the 2-core host; the collective itself about 1 us. So that a collective nobody waits for
//     still starts, the sleeping thread then looks at the queue every kBlockingCallerPoll.
//
// A queued collective is its Work, its fingerprint, its timeout and its body, held as they are:
// no wrapping closure, so queueing a small collective allocates as little as possible.
class RingBackend::Executor : public Work::Helper {
 public:
  struct Task {
    WorkPtr work;
    Fingerprint fingerprint;
    std::chrono::milliseconds timeout{0};
    Body body;
    bool small = false;  // few enough bytes that the blocking caller's way may apply
    std::chrono::steady_clock::time_point queued_at{};
  };

  // `cpu` >= 0: the thread runs on that CPU only (see pick_cpu), and, having a core of its own,
  // polls for the next collective for a moment before it sleeps: back-to-back collectives then
  // start without a wake-up. Tasks run through `backend`'s run_task.
  Executor(RingBackend& backend, int cpu) : backend_(backend), cpu_(cpu), spin_for_work_(cpu >= 0), thread_([this] {
    if (cpu_ >= 0) bind_to(cpu_);
    loop();
  }) {}
  ~Executor() { shutdown(); }

  void enqueue(Task task) {
    bool wake;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      // A streak of small collectives, each awaited before the next call: a blocking caller.
      blocking_streak_ = task.small && last_small_ && last_awaited_ ? blocking_streak_ + 1 : 0;
      blocking_caller_ = blocking_streak_ >= kBlockingStreak;
      last_small_ = task.small;
      last_awaited_ = false;
      last_work_ = task.work.get();
      last_enqueue_ = task.queued_at = std::chrono::steady_clock::now();
      queue_.push_back(std::move(task));
      queued_.store(queue_.size(), std::memory_order_release);
      // A runner drains what is queued behind it, and a poller sees it. A thread in its timed sleep
      // is left asleep for a blocking caller; one in an untimed sleep is woken, or nothing would
      // start the collective if this caller does not wait after all.
      wake = !running_ && sleeping_ && !(blocking_caller_ && timed_sleep_);
    }
    if (wake) changed_.notify_one();
  }

  // Work::wait() calls this first. It notes that the caller waits (the blocking caller's streak),
  // then lets the caller run queued collectives itself, in order, until `target` is done, unless
  // another runner has them (then the caller just waits for its Work).
  void help(Work& target) override {
    std::unique_lock<std::mutex> lock(mutex_);
    if (&target == last_work_) last_awaited_ = true;
    if (target.is_completed() || running_ || queue_.empty()) return;
    // A bound thread that is awake (polling) takes the work on its own core within microseconds.
    if (spin_for_work_ && !sleeping_) return;
    running_ = true;
    // Standing in for a sleeping eager thread, the caller runs on that thread's core too: the
    // ranks would otherwise share a core again (see pick_cpu). A blocking caller keeps its own
    // core: it runs every collective itself, and two affinity changes a call cost more than one.
    cpu_set_t caller_cpus;
    bool rebound = cpu_ >= 0 && !blocking_caller_ &&
                   pthread_getaffinity_np(pthread_self(), sizeof caller_cpus, &caller_cpus) == 0;
    if (rebound) bind_to(cpu_);
    while (!target.is_completed() && !queue_.empty()) run_front(lock, &counts_.by_caller);
    if (rebound) pthread_setaffinity_np(pthread_self(), sizeof caller_cpus, &caller_cpus);
    running_ = false;
    bool wake = !queue_.empty() || stopping_;
    lock.unlock();
    if (wake) changed_.notify_one();  // what the caller left behind goes to the thread
  }

  RunCounts counts() {
    std::lock_guard<std::mutex> lock(mutex_);
    return counts_;
  }

  void shutdown() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  // Small collectives awaited one by one before the caller counts as a blocking caller.
  static constexpr int kBlockingStreak = 3;
  // How often the thread looks at the queue while it leaves a blocking caller's collectives to it.
  // It takes a collective that has waited one whole period, so one that nobody waits for starts
  // within two periods.
  static constexpr auto kBlockingCallerPoll = std::chrono::microseconds(200);
  // After this long without a collective, the thread goes back to an untimed sleep.
  static constexpr auto kBlockingCallerIdle = std::chrono::milliseconds(20);

  // Pops the first task and runs it with the lock released; the claim (running_) keeps the order.
  void run_front(std::unique_lock<std::mutex>& lock, uint64_t* counter) {
    ++*counter;
    Task task = std::move(queue_.front());
    queue_.pop_front();
    queued_.store(queue_.size(), std::memory_order_release);
    lock.unlock();
    backend_.run_task(task.fingerprint, task.timeout, task.body, *task.work);
    lock.lock();
  }

  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    auto ready = [&] { return (stopping_ && !running_) || (!queue_.empty() && !running_); };
    for (;;) {
      if (spin_for_work_ && !blocking_caller_ && queue_.empty() && !stopping_) {
        lock.unlock();
        SpinThenSleep spin;
        while (queued_.load(std::memory_order_acquire) == 0 && spin.keep_spinning()) SpinThenSleep::pause();
        lock.lock();
      }
      sleeping_ = true;
      if (blocking_caller_ && std::chrono::steady_clock::now() - last_enqueue_ < kBlockingCallerIdle) {
        // Leave the queue to the blocking caller; take only what nobody came to wait for within a
        // whole poll period (taking a collective the caller is about to wait for would cost it
        // the hand-off this mode avoids).
        timed_sleep_ = true;
        changed_.wait_for(lock, kBlockingCallerPoll);
        timed_sleep_ = false;
        sleeping_ = false;
        bool overdue = !queue_.empty() && std::chrono::steady_clock::now() - queue_.front().queued_at >= kBlockingCallerPoll;
        bool take = !running_ && (stopping_ || (!queue_.empty() && (!blocking_caller_ || overdue)));
        if (!take) continue;
      } else {
        changed_.wait(lock, ready);
        sleeping_ = false;
      }
      if (queue_.empty()) return;  // stopping, and everything queued has run
      running_ = true;
      while (!queue_.empty()) run_front(lock, &counts_.by_thread);
      running_ = false;
    }
  }

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Task> queue_;
  std::atomic<size_t> queued_{0};  // queue_.size(), readable without the lock (the poll)
  bool running_ = false;
  bool stopping_ = false;
  bool sleeping_ = false;     // the thread waits on changed_ (else it polls or runs)
  bool timed_sleep_ = false;  // ... and will look at the queue again by itself
  // The blocking caller's bookkeeping (see the class comment).
  bool blocking_caller_ = false;
  int blocking_streak_ = 0;
  bool last_small_ = false, last_awaited_ = false;
  const Work* last_work_ = nullptr;
  std::chrono::steady_clock::time_point last_enqueue_{};
  RunCounts counts_;
  RingBackend& backend_;
  const int cpu_;
  const bool spin_for_work_;
  std::thread thread_;  // last: it starts after the members it uses exist
};

RingBackend::RingBackend(std::shared_ptr<Store> store, int rank, int size, const ProcessGroupOptions& options)
    : ProcessGroup(rank, size),
      store_(std::move(store)),
      options_(options),
      debug_detail_(options.debug_detail.value_or(debug_detail_from_environment())),
      small_message_bytes_(options.small_message_bytes.value_or(env_size("TINYDDP_SMALL_MESSAGE_BYTES", kSmallMessageBytes))),
      peers_(size_t(size), nullptr) {
  TINYDDP_CHECK(store_ != nullptr, "ring backend: no store was given; hint: pass the TcpStore (or HashStore) the ranks share");
  TINYDDP_CHECK(size >= 1 && rank >= 0 && rank < size, "ring backend: rank ", rank, " of world size ", size,
                " is impossible; hint: ranks go from 0 to world size - 1");
  const std::string& mode = options.transport;
  TINYDDP_CHECK(mode == "auto" || mode == "tcp" || mode == "shm", "ring backend: unknown transport '", mode,
                "'; hint: use tcp, shm or auto");

  // Every rank's n-th group of this name meets the others' n-th one, even on a reused store.
  const std::string base = "tinyddp/pg/" + options.group_name + "/";
  const int64_t generation = store_->add(base + "generation/" + std::to_string(rank), 1);
  const std::string prefix = base + std::to_string(generation) + "/";

  // Who shares this host?
  store_->set(prefix + "host/" + std::to_string(rank), std::to_string(::getpid()) + " " + host_identity());
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(prefix + "host/" + std::to_string(r));
  store_->wait(keys, options.timeout);
  std::vector<std::string> hosts = store_->multi_get(keys);
  std::vector<int> pids(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {  // "pid identity"
    auto space = hosts[r].find(' ');
    pids[r] = std::stoi(hosts[r].substr(0, space));
    hosts[r] = hosts[r].substr(space + 1);
  }
  std::vector<int> local, remote;
  for (int r = 0; r < size; ++r) (hosts[r] == hosts[rank] ? local : remote).push_back(r);

  std::vector<int> tcp_peers;
  if (mode == "tcp") {
    for (int r = 0; r < size; ++r)
      if (r != rank) tcp_peers.push_back(r);
  } else {
    if (mode == "shm") {
      std::string others;
      for (int r : remote) others += (others.empty() ? "" : ", ") + std::to_string(r);
      TINYDDP_CHECK(remote.empty(), "ring backend: transport 'shm' needs every rank on one host, but rank(s) ", others,
                    " run on another host than rank ", rank, "; hint: use transport 'auto' (shm within a host, tcp across) or 'tcp'");
    }
    tcp_peers = remote;
    if (local.size() > 1) {
      ShmTransportOptions shm_options;
      shm_options.ring_bytes = options.shm_ring_bytes;
      // Large turns while every rank of the host has a core of its own; the default 128 KiB when
      // they share cores. Side by side, in-place busbw medians of 3 alternating runs, 1 MiB turns
      // against 128 KiB: 2 ranks on 2 cores 256K/1M/4M/16M/64M/256M 11.4/16.2/14.4/8.6/6.4/5.7 ->
      // 15.2/18.1/18.5/10.1/7.0/6.1 GB/s; 4 ranks on 2 cores 1/4/16/64 MiB 5.0/5.2/3.5/3.2 ->
      // 4.3/5.1/3.2/2.9. (Over tcp, 1 MiB turns won in both cases: see tcp_transport.cpp.)
      if (local.size() <= std::max(1u, std::thread::hardware_concurrency())) shm_options.segment_bytes = size_t(1) << 20;
      shm_ = std::make_unique<ShmTransport>(*store_, prefix, rank, local, options.timeout, shm_options);
      transports_.push_back(shm_.get());
    }
  }
  if (!tcp_peers.empty()) {
    TcpTransportOptions tcp_options;
    tcp_options.token = options.token.value_or(TcpStore::token_from_environment());
    tcp_options.socket_buffer_bytes = options.tcp_buffer_bytes ? options.tcp_buffer_bytes : env_size("TINYDDP_TCP_BUFFER_BYTES", 0);
    // The store's host: every rank reaches it, so the interface toward it faces the other hosts.
    Store* inner = store_.get();
    while (auto* prefixed = dynamic_cast<PrefixStore*>(inner)) inner = &prefixed->underlying();
    if (const auto* tcp_store = dynamic_cast<const TcpStore*>(inner)) tcp_options.route_to = tcp_store->host();
    tcp_ = std::make_unique<TcpTransport>(*store_, prefix, rank, tcp_peers, hosts, pids, options.timeout, tcp_options);
    transports_.push_back(tcp_.get());
  }
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    bool over_tcp = std::find(tcp_peers.begin(), tcp_peers.end(), r) != tcp_peers.end();
    peers_[r] = over_tcp ? tcp_->connection(r) : shm_->connection(r);
  }
  if (const char* set = std::getenv("TINYDDP_SMALL_MESSAGE_BYTES");
      size == 2 && tcp_ && !shm_ && !options.small_message_bytes && !(set && *set))
    small_message_bytes_ = kSmallMessageBytesTcpPair;
  if (local.size() > std::max(1u, std::thread::hardware_concurrency())) SpinThenSleep::set_budget(kOversubscribedSpin);
  if (const char* spin = std::getenv("TINYDDP_SPIN_US"); spin && *spin)  // for tuning on a new host
    SpinThenSleep::set_budget(std::chrono::microseconds(std::stoll(spin)));
  const int cpu = pick_cpu(int(std::find(local.begin(), local.end(), rank) - local.begin()), int(local.size()));
  SpinThenSleep::set_yield_while_spinning(cpu < 0);
  executor_ = std::make_shared<Executor>(*this, cpu);
}

RingBackend::~RingBackend() {
  executor_->shutdown();  // queued collectives still run: the peers expect them
}

RingBackend::RunCounts RingBackend::collectives_run() const { return executor_->counts(); }

std::string RingBackend::transport_to(int peer) const {
  if (peer == rank()) return "self";
  return peers_.at(size_t(peer))->transport().name();
}

Ring RingBackend::ring() const {
  return Ring{rank(), size(), peers_[size_t((rank() + 1) % size())], peers_[size_t((rank() + size() - 1) % size())]};
}

WorkPtr RingBackend::enqueue(Fingerprint fingerprint, const CallOptions& call, Body body) {
  std::lock_guard<std::mutex> lock(enqueue_mutex_);
  fingerprint.sequence = next_sequence_++;
  auto work = std::make_shared<Work>(fingerprint);
  work->set_helper(executor_);
  auto timeout = call.timeout.count() > 0 ? call.timeout : options_.timeout;
  const size_t bytes = size_t(fingerprint.count) * dtype_size(DType(fingerprint.dtype));  // per rank; a barrier's is 0
  const bool small = bytes <= std::min(small_message_bytes_, kBlockingCallerBytes);
  executor_->enqueue({work, fingerprint, timeout, std::move(body), small});
  return work;
}

void RingBackend::run_task(const Fingerprint& fingerprint, std::chrono::milliseconds timeout, const Body& body,
                           Work& work) {
  try {
    TINYDDP_CHECK(aborted_.empty(), "rank ", rank(), ": ", work.description(),
                  " cannot run: this process group was aborted by an earlier failure: ", aborted_,
                  "; hint: handle that failure, then create a new process group on every rank");
    CollectiveContext ctx;
    ctx.rank = rank();
    ctx.work = &work;
    ctx.dtype = DType(fingerprint.dtype);
    ctx.op = ReduceOp(fingerprint.op);
    ctx.world_size = size();
    ctx.timeout = timeout;
    ctx.deadline = std::chrono::steady_clock::now() + timeout;
    ctx.transports = transports_;
    if (debug_detail_ && size() > 1) check_fingerprints(fingerprint, ctx);
    body(ctx);
    work.mark_succeeded();
  } catch (const MismatchError&) {
    work.mark_failed(std::current_exception());
  } catch (const std::exception& e) {
    // A timeout or a peer failure leaves the byte streams out of step: abort the group and tell
    // the peers, so that they fail now and name this failure instead of timing out.
    if (aborted_.empty()) {
      const auto* error = dynamic_cast<const Error*>(&e);
      aborted_ = error ? error->message() : e.what();
      std::string reason = aborted_.substr(0, aborted_.find("; hint:"));  // the peers add their own hint
      for (Transport* t : transports_) t->abort("rank " + std::to_string(rank()) + " failed: " + reason);
    }
    work.mark_failed(std::current_exception());
  }
}

void RingBackend::check_fingerprints(const Fingerprint& mine, const CollectiveContext& ctx) {
  std::vector<Fingerprint> all(static_cast<size_t>(size()));
  CollectiveContext check = ctx;
  check.phase = " (TINYDDP_DEBUG=DETAIL fingerprint exchange)";
  direct_all_gather(peers_, rank(), reinterpret_cast<const std::byte*>(&mine), reinterpret_cast<std::byte*>(all.data()),
                    sizeof(Fingerprint), check);
  std::string mismatch = fingerprint_mismatch(all);
  if (!mismatch.empty()) throw MismatchError(mismatch, "", __FILE__, __LINE__);
}

void RingBackend::all_reduce_bytes(const std::byte* in, std::byte* out, size_t count, const CollectiveContext& ctx) {
  const size_t bytes = count * dtype_size(ctx.dtype);
  if (size() == 1 || bytes == 0) {
    if (out != in && bytes > 0) std::memcpy(out, in, bytes);
    return;
  }
  if (bytes <= small_message_bytes_)
    direct_all_reduce(peers_, rank(), in, out, count, ctx);
  else
    ring_all_reduce(ring(), in, out, count, ctx);
}

namespace {
Fingerprint fingerprint_of(CollectiveKind kind, const Tensor& t, int64_t count, std::optional<ReduceOp> op, int root = -1) {
  Fingerprint f;
  f.kind = uint8_t(kind);
  f.dtype = uint8_t(t.defined() ? t.dtype() : DType::i32);
  f.count = count;
  f.reduces = op.has_value();
  f.op = uint8_t(op.value_or(ReduceOp::sum));
  f.root = root;
  return f;
}
}  // namespace

WorkPtr RingBackend::all_reduce(const Tensor& tensor, ReduceOp op, const CallOptions& call) {
  check_tensor(tensor, "all_reduce", "tensor");
  return enqueue(fingerprint_of(CollectiveKind::all_reduce, tensor, tensor.numel(), op), call,
                 [this, tensor](const CollectiveContext& ctx) {
                   Tensor staging;
                   const Tensor& host = host_input(tensor, staging);
                   all_reduce_bytes(bytes_of(host), bytes_of(host), size_t(host.numel()), ctx);
                   write_back(tensor, host);
                 });
}

WorkPtr RingBackend::all_reduce_into(const Tensor& output, const Tensor& input, ReduceOp op, const CallOptions& call) {
  check_tensor(output, "all_reduce_into", "output");
  check_tensor(input, "all_reduce_into", "input");
  check_same(output, input, "all_reduce_into");
  return enqueue(fingerprint_of(CollectiveKind::all_reduce, input, input.numel(), op), call,
                 [this, output, input](const CollectiveContext& ctx) {
                   Tensor in_staging, out_staging;
                   const Tensor& in = host_input(input, in_staging);
                   const Tensor& out = host_output(output, out_staging);
                   all_reduce_bytes(bytes_of(in), bytes_of(out), size_t(in.numel()), ctx);
                   write_back(output, out);
                 });
}

WorkPtr RingBackend::all_reduce_coalesced(const std::vector<Tensor>& tensors, ReduceOp op, const CallOptions& call) {
  TINYDDP_CHECK(!tensors.empty(), "all_reduce_coalesced: no tensors were given; hint: pass at least one tensor");
  int64_t total = 0;
  for (const Tensor& t : tensors) {
    check_tensor(t, "all_reduce_coalesced", "tensor");
    TINYDDP_CHECK(t.dtype() == tensors[0].dtype(), "all_reduce_coalesced: tensors mix ", dtype_name(tensors[0].dtype()),
                  " and ", dtype_name(t.dtype()), "; hint: coalesce tensors of one dtype per call");
    total += t.numel();
  }
  return enqueue(fingerprint_of(CollectiveKind::all_reduce, tensors[0], total, op), call,
                 [this, tensors](const CollectiveContext& ctx) {
                   for (const Tensor& t : tensors) {
                     Tensor staging;
                     const Tensor& host = host_input(t, staging);
                     all_reduce_bytes(bytes_of(host), bytes_of(host), size_t(host.numel()), ctx);
                     write_back(t, host);
                   }
                 });
}

WorkPtr RingBackend::broadcast(const Tensor& tensor, int root, const CallOptions& call) {
  check_tensor(tensor, "broadcast", "tensor");
  check_root(root, "broadcast");
  return enqueue(fingerprint_of(CollectiveKind::broadcast, tensor, tensor.numel(), std::nullopt, root), call,
                 [this, tensor, root](const CollectiveContext& ctx) {
                   if (size() == 1 || tensor.numel() == 0) return;
                   Tensor staging;
                   const Tensor& host = host_input(tensor, staging);
                   chain_broadcast(ring(), bytes_of(host), host.nbytes(), root, ctx);
                   if (rank() != root) write_back(tensor, host);
                 });
}

WorkPtr RingBackend::all_gather(const Tensor& output, const Tensor& input, const CallOptions& call) {
  check_tensor(output, "all_gather", "output");
  check_tensor(input, "all_gather", "input");
  TINYDDP_CHECK(output.dtype() == input.dtype() && output.numel() == input.numel() * size(), "all_gather: output ",
                output.describe(), " must hold world size (", size(), ") x input ", input.describe(),
                "; hint: allocate the output with ", input.numel() * size(), " elements of ", dtype_name(input.dtype()));
  return enqueue(fingerprint_of(CollectiveKind::all_gather, input, input.numel(), std::nullopt), call,
                 [this, output, input](const CollectiveContext& ctx) {
                   Tensor in_staging, out_staging;
                   const Tensor& in = host_input(input, in_staging);
                   const Tensor& out = host_output(output, out_staging);
                   if (size() == 1) {
                     if (in.numel() > 0 && bytes_of(out) != bytes_of(in)) std::memmove(bytes_of(out), bytes_of(in), in.nbytes());
                   } else {
                     ring_all_gather(ring(), bytes_of(in), bytes_of(out), size_t(in.numel()), ctx);
                   }
                   write_back(output, out);
                 });
}

WorkPtr RingBackend::reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op, const CallOptions& call) {
  check_tensor(output, "reduce_scatter", "output");
  check_tensor(input, "reduce_scatter", "input");
  TINYDDP_CHECK(output.dtype() == input.dtype() && input.numel() == output.numel() * size(), "reduce_scatter: input ",
                input.describe(), " must hold world size (", size(), ") x output ", output.describe(),
                "; hint: the input is the concatenation of one output-sized part per rank");
  return enqueue(fingerprint_of(CollectiveKind::reduce_scatter, output, output.numel(), op), call,
                 [this, output, input](const CollectiveContext& ctx) {
                   Tensor in_staging, out_staging;
                   const Tensor& in = host_input(input, in_staging);
                   const Tensor& out = host_output(output, out_staging);
                   if (size() == 1) {
                     if (in.numel() > 0) std::memmove(bytes_of(out), bytes_of(in), in.nbytes());
                   } else {
                     ring_reduce_scatter(ring(), bytes_of(in), bytes_of(out), size_t(out.numel()), ctx);
                   }
                   write_back(output, out);
                 });
}

WorkPtr RingBackend::barrier(const CallOptions& call) {
  return enqueue(fingerprint_of(CollectiveKind::barrier, Tensor(), 0, std::nullopt), call,
                 [this](const CollectiveContext& ctx) {
                   if (size() == 1) return;
                   // A one-element all-reduce: nobody gets past it before everyone has sent.
                   int32_t token = 1, total = 0;
                   CollectiveContext as_sum = ctx;
                   as_sum.dtype = DType::i32;
                   as_sum.op = ReduceOp::sum;
                   direct_all_reduce(peers_, rank(), reinterpret_cast<const std::byte*>(&token),
                                     reinterpret_cast<std::byte*>(&total), 1, as_sum);
                 });
}

}  // namespace tinyddp::comm
