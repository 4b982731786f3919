// Executor: a process group's communication thread, and the queue of collectives it runs.
//
// Collectives run one at a time, in call order, by one runner at a time, claimed under the queue's
// mutex: the communication thread, or a caller waiting on a collective nobody has started (Work's
// helper). Ownership changes hands through that claim, never by blocking on a lock, because on a
// busy 2-core host every blocked-then-woken hand-off costs tens of microseconds.
//
// Two ways to start a collective, chosen per call from what the caller did before:
//   - eager (the default): submit wakes the communication thread at once, so the collective runs
//     while the caller goes on computing (DDP's bucket all-reduces behind the backward pass).
//   - a blocking caller's: when the last few collectives were small and each was waited for before
//     the next was called (a loss averaged every step, a barrier, an MPI-style loop), submit does
//     not wake the thread: the caller is about to wait, and then runs the collective itself on its
//     own core. A wake-up, and the core the woken thread takes from the caller, cost far more than
//     such a collective itself. So that a collective nobody waits for still starts, the sleeping
//     thread then looks at the queue every tuning::kBlockingCallerPoll.
//
// The Executor does not know what a collective does: it hands each task to the runner it was given
// (the process group's), and completes the task's Work with the outcome.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "tinyddp/comm/fingerprint.h"
#include "tinyddp/comm/wait_policy.h"
#include "tinyddp/comm/work.h"
#include "tinyddp/core/function_ref.h"

namespace tinyddp::comm {

struct CollectiveContext;

class Executor : public Work::Helper, public std::enable_shared_from_this<Executor> {
 public:
  // What a collective does once it runs, given the call's context (name, deadline, transports, ...):
  // owned by a queued task, borrowed from its caller by a claimed one (run_claimed).
  using Body = std::function<void(const CollectiveContext&)>;
  using BodyRef = FunctionRef<void(const CollectiveContext&)>;
  // A queued collective: its Work, its fingerprint, its timeout and its body, held as they are (no
  // wrapping closure, so queueing a small collective allocates as little as possible).
  struct Task {
    WorkPtr work;
    Fingerprint fingerprint;
    std::chrono::milliseconds timeout{0};
    Body body;              // empty in a claimed task: its caller still holds what it does
    bool small = false;     // few enough bytes that the blocking caller's way may apply
    bool blocking = false;  // its caller returns only once it is done (CallOptions::blocking)
    std::chrono::steady_clock::time_point queued_at{};  // when it was called: the caller's clock reading
    // Set when it starts as it is queued (a claimed blocking call): the runner need not read the clock.
    std::chrono::steady_clock::time_point started_at{};
  };
  // Runs one task, doing `body`, on the calling thread; a collective's failure is thrown.
  using Runner = std::function<void(const Task&, BodyRef body)>;
  // How many collectives ran on the communication thread, and how many on a waiting caller's.
  struct RunCounts {
    uint64_t by_thread = 0;
    uint64_t by_caller = 0;
  };

  // Starts the communication thread. `cpu` >= 0: it runs on that CPU only (cpu_binding.h) and,
  // having a core of its own, polls for the next collective for a moment (wait.spin) before it
  // sleeps: back-to-back collectives then start without a wake-up. Held by a shared_ptr (its Works
  // hold it weakly).
  Executor(Runner run, int cpu, WaitPolicy wait);
  ~Executor() override;  // shutdown()

  // Hands a call over, in one hold of the executor's lock, so that the calls have one order for
  // everyone: the caller's numbers and records, the queue and the runners.
  //   - `admit(task, runs_here)` is called first: the caller finishes the task there (numbers it,
  //     makes its Work, records it; a task that will be queued also needs its body).
  //   - The call counts in the blocking caller's streak.
  //   - A blocking call (Task::blocking) when nothing is queued or running is claimed and handed
  //     back, started_at set: its caller runs it at once (run_claimed), past the queue its wait
  //     would take. Any other call is queued, with this executor as its Work's helper, and nothing
  //     is returned.
  struct Claimed {
    Task task;
    bool stand_in = false;  // run it on the communication thread's CPU (see help)
  };
  using Admit = FunctionRef<void(Task& task, bool runs_here)>;
  std::optional<Claimed> submit(Task task, Admit admit);
  // Runs a claimed task on the calling thread, doing `body`, completes its Work, and releases the
  // claim. Its Work gets no helper and no waiter: nobody else holds it before this returns. The
  // caller must not hold a lock that another caller's submit takes.
  void run_claimed(Claimed claimed, BodyRef body);
  // Work::wait() calls this first; see the header comment.
  void help(Work& target) override;
  RunCounts counts();
  // Whether the calling thread runs a collective as a blocking caller, on no core of its own (the
  // runner's waits should then yield the core now and then: the peer it waits for may share it).
  static bool running_as_unbound_caller();
  // Runs what is still queued (the peers expect those collectives), then ends the thread.
  void shutdown();

 private:
  void run_front(std::unique_lock<std::mutex>& lock, uint64_t* counter);
  // Runs `task` (doing `body`) on the calling thread and completes its Work with the outcome
  // (`unshared`: a claimed task's, which nobody else holds yet, so nobody waits on it).
  void run_and_complete(const Task& task, BodyRef body, bool unshared = false);
  void loop();
  void poll_for_work(std::unique_lock<std::mutex>& lock);
  bool sleep_until_work(std::unique_lock<std::mutex>& lock);

  const Runner run_;
  const WaitPolicy wait_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Task> queue_;
  std::atomic<size_t> queued_{0};  // queue_.size(), readable without the lock (the poll)
  bool running_ = false;
  bool stopping_ = false;
  bool sleeping_ = false;     // the thread waits on changed_ (else it polls or runs)
  bool timed_sleep_ = false;  // ... and will look at the queue again by itself
  // The blocking caller's bookkeeping (see the header comment).
  bool blocking_caller_ = false;
  int blocking_streak_ = 0;
  bool last_small_ = false, last_awaited_ = false;
  const Work* last_work_ = nullptr;
  std::chrono::steady_clock::time_point last_submit_{};
  RunCounts counts_;
  const int cpu_;
  const bool spin_for_work_;
  std::thread thread_;  // last: it starts after the members it uses exist
};

}  // namespace tinyddp::comm
