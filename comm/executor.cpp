#include "tinyddp/comm/executor.h"

#include <optional>

#include "tinyddp/comm/cpu_binding.h"
#include "tinyddp/comm/tuning.h"

namespace tinyddp::comm {

namespace {
thread_local bool tl_unbound_caller = false;
}  // namespace

bool Executor::running_as_unbound_caller() { return tl_unbound_caller; }

Executor::Executor(Runner run, int cpu, WaitPolicy wait)
    : run_(std::move(run)), wait_(wait), cpu_(cpu), spin_for_work_(cpu >= 0), thread_([this] {
        if (cpu_ >= 0) bind_this_thread(cpu_);
        loop();
      }) {}

Executor::~Executor() { shutdown(); }

std::optional<Executor::Claimed> Executor::submit(Task task, Admit admit) {
  std::optional<Claimed> claimed;
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // A blocking call with nothing before it: its caller runs it now instead of queueing it and then
    // taking it back at its wait. As in help, not while a bound thread is awake: that takes it on its
    // own core within microseconds.
    const bool runs_here = task.blocking && !running_ && queue_.empty() && !stopping_ &&
                           !(spin_for_work_ && !sleeping_);
    admit(task, runs_here);
    // A streak of small collectives, each awaited before the next call: a blocking caller.
    blocking_streak_ = task.small && last_small_ && last_awaited_ ? blocking_streak_ + 1 : 0;
    blocking_caller_ = blocking_streak_ >= tuning::kBlockingStreak;
    last_small_ = task.small;
    last_awaited_ = runs_here;
    last_work_ = task.work.get();
    last_submit_ = task.queued_at;
    if (runs_here) {
      running_ = true;
      ++counts_.by_caller;
      task.started_at = task.queued_at;
      claimed = Claimed{std::move(task), cpu_ >= 0 && !blocking_caller_};
    } else {
      // Whoever waits for a queued task is offered the queue (help).
      task.work->set_helper(weak_from_this(), wait_.spin);
      queue_.push_back(std::move(task));
      queued_.store(queue_.size(), std::memory_order_release);
      // A runner drains what is queued behind it, and a poller sees it. A thread in its timed sleep
      // is left asleep for a blocking caller; one in an untimed sleep is woken, or nothing would
      // start the collective if this caller does not wait after all.
      wake = !running_ && sleeping_ && !(blocking_caller_ && timed_sleep_);
    }
  }
  if (wake) changed_.notify_one();
  return claimed;
}

void Executor::run_claimed(Claimed claimed, BodyRef body) {
  {
    // As in help: standing in for the sleeping thread, on its core.
    std::optional<ScopedCpuBinding> standing_in;
    if (claimed.stand_in) standing_in.emplace(cpu_);
    tl_unbound_caller = !standing_in;
    run_and_complete(claimed.task, body, /*unshared=*/true);
    tl_unbound_caller = false;
  }
  std::unique_lock<std::mutex> lock(mutex_);
  running_ = false;
  const bool wake = !queue_.empty() || stopping_;  // what other callers queued meanwhile goes to the thread
  lock.unlock();
  if (wake) changed_.notify_one();
}

// It notes that the caller waits (the blocking caller's streak), then lets the caller run queued
// collectives itself, in order, until `target` is done, unless another runner has them (then the
// caller just waits for its Work).
void Executor::help(Work& target) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (&target == last_work_) last_awaited_ = true;
  if (target.is_completed() || running_ || queue_.empty()) return;
  // A bound thread that is awake (polling) takes the work on its own core within microseconds.
  if (spin_for_work_ && !sleeping_) return;
  running_ = true;
  {
    // Standing in for a sleeping eager thread, the caller runs on that thread's core too: the
    // ranks would otherwise share a core again (cpu_binding.h). A blocking caller keeps its own
    // core: it runs every collective itself, and two affinity changes a call cost more than one.
    std::optional<ScopedCpuBinding> standing_in;
    if (cpu_ >= 0 && !blocking_caller_) standing_in.emplace(cpu_);
    tl_unbound_caller = !standing_in;
    while (!target.is_completed() && !queue_.empty()) run_front(lock, &counts_.by_caller);
    tl_unbound_caller = false;
  }
  running_ = false;
  bool wake = !queue_.empty() || stopping_;
  lock.unlock();
  if (wake) changed_.notify_one();  // what the caller left behind goes to the thread
}

Executor::RunCounts Executor::counts() {
  std::lock_guard<std::mutex> lock(mutex_);
  return counts_;
}

void Executor::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
}

// Pops the first task and runs it with the lock released; the claim (running_) keeps the order.
void Executor::run_front(std::unique_lock<std::mutex>& lock, uint64_t* counter) {
  ++*counter;
  Task task = std::move(queue_.front());
  queue_.pop_front();
  queued_.store(queue_.size(), std::memory_order_release);
  lock.unlock();
  run_and_complete(task, task.body);
  lock.lock();
}

void Executor::run_and_complete(const Task& task, BodyRef body, bool unshared) {
  try {
    run_(task, body);
    if (unshared)
      task.work->mark_succeeded_unshared();
    else
      task.work->mark_succeeded();
  } catch (...) {
    task.work->mark_failed(std::current_exception());
  }
}

void Executor::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    if (spin_for_work_ && !blocking_caller_ && queue_.empty() && !stopping_) poll_for_work(lock);
    if (!sleep_until_work(lock)) continue;
    if (queue_.empty()) return;  // stopping, and everything queued has run
    running_ = true;
    while (!queue_.empty()) run_front(lock, &counts_.by_thread);
    running_ = false;
  }
}

// Looks at the queue without the lock for a moment (the group's spin budget): a collective called
// right after the last one starts without a wake-up.
void Executor::poll_for_work(std::unique_lock<std::mutex>& lock) {
  lock.unlock();
  SpinThenSleep spin(wait_.spin);
  while (queued_.load(std::memory_order_acquire) == 0 && spin.keep_spinning()) SpinThenSleep::pause();
  lock.lock();
}

// Sleeps until there is work to take (or the executor stops); false when the thread should look
// again instead of running what is queued.
bool Executor::sleep_until_work(std::unique_lock<std::mutex>& lock) {
  sleeping_ = true;
  if (blocking_caller_ && std::chrono::steady_clock::now() - last_submit_ < tuning::kBlockingCallerIdle) {
    // Leave the queue to the blocking caller; take only what nobody came to wait for within a
    // whole poll period (taking a collective the caller is about to wait for would cost it the
    // hand-off this mode avoids).
    timed_sleep_ = true;
    changed_.wait_for(lock, tuning::kBlockingCallerPoll);
    timed_sleep_ = false;
    sleeping_ = false;
    bool overdue = !queue_.empty() &&
                   std::chrono::steady_clock::now() - queue_.front().queued_at >= tuning::kBlockingCallerPoll;
    return !running_ && (stopping_ || (!queue_.empty() && (!blocking_caller_ || overdue)));
  }
  changed_.wait(lock, [&] { return (stopping_ && !running_) || (!queue_.empty() && !running_); });
  sleeping_ = false;
  return true;
}

}  // namespace tinyddp::comm
