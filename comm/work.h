// Work: the handle an asynchronous collective returns (PyTorch's c10d::Work).
//
// A collective is queued when it is called and runs later on the process group's communication
// thread, so the caller can go on computing (DDP launches a bucket's all-reduce and keeps running
// the backward pass). Work says when it is done and carries its error, if any:
//
//   auto work = pg->all_reduce(grad);   // returns at once
//   ...                                 // compute overlaps the communication
//   work->wait();                       // the result may be used now; rethrows the collective's error
//
// wait() (not wait_for) first offers the waiting thread to whoever queued the collective (its
// "helper", the host backend's Executor): when the communication thread has not started the queued
// collectives yet, the caller runs them itself instead of sleeping, which saves two thread
// hand-offs on every small, immediately awaited collective. The Executor also learns from it which
// callers wait for each collective before the next, and leaves their small collectives to them.
// Work knows the helper only through the small interface below; the helper completes the Work.
//
// On a device, waiting need not block the host. The nccl backend's helper answers wait() by making the
// caller's stream (its device's default stream, where tinyddp launches compute) wait for the
// collective's end event, as PyTorch's ProcessGroupNCCL does: kernels launched afterwards run after
// the collective, a host read of the result (a device-to-host copy on that stream) waits for it, and
// the host goes on queueing work meanwhile. synchronize() is for when the host itself must know the
// collective is done (timing it, a barrier). The collective's timeout still applies: the backend's
// watchdog aborts it then, and the error is thrown by the next call on the group, by synchronize(),
// or by wait() when it has already failed.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "tinyddp/comm/fingerprint.h"
#include "tinyddp/comm/tuning.h"

namespace tinyddp::comm {

class Work {
 public:
  using Duration = std::chrono::milliseconds;

  // What wait() offers the waiting thread to first (the backend's queue; see the header comment).
  class Helper {
   public:
    virtual ~Helper() = default;
    // Runs queued collectives on the calling thread until `target` is done, or returns at once.
    virtual void help(Work& target) = 0;
    // Orders the calling thread's device work after `target` without blocking the host; false when
    // the host must block instead (the default: a host backend, a barrier, a failed group).
    virtual bool order_after(Work& /*target*/) { return false; }
  };

  explicit Work(std::string description);
  // A collective's Work, described from its fingerprint only when someone asks (an error message,
  // a trace): writing "all_reduce #3 f32 x1024 sum" on every call would cost a small collective
  // several allocations.
  explicit Work(const Fingerprint& fingerprint);
  // A Work that is already complete (a collective that had nothing to do, world size 1, ...).
  static std::shared_ptr<Work> completed(std::string description);

  // True once the collective finished, successfully or not. Never blocks.
  bool is_completed() const { return state_.load(std::memory_order_acquire) != kPending; }
  bool is_success() const { return state_.load(std::memory_order_acquire) == kSucceeded; }
  // Returns when the caller may use the result: on the host, once the collective finished; on a
  // device, once the caller's stream is ordered after it (see the header comment). Rethrows the
  // collective's error. The collective's own timeout bounds it.
  void wait();
  // Blocks the host until the collective finished, on a device too; rethrows its error.
  void synchronize();
  // Waits at most `timeout`: false if the collective is still running then; rethrows its error.
  bool wait_for(Duration timeout);
  // The error the collective failed with (nullptr while pending or after success).
  std::exception_ptr exception() const;
  // "all_reduce #3 f32 x1024 sum": what this work is, for messages and traces.
  const std::string& description() const;

  // ---- for backends ----
  void mark_succeeded();
  // The same for a Work nobody else holds yet (a blocking call its caller ran at once): with no
  // waiter possible, it skips the mutex and the wake-up, which cost a small collective measurably.
  void mark_succeeded_unshared() { state_.store(kSucceeded, std::memory_order_release); }
  void mark_failed(std::exception_ptr error);
  // Offered the waiting thread by wait() (see the header comment). Held weakly: a Work may outlive
  // its backend. `spin`: how long a waiting thread may spin before it sleeps (the group's
  // WaitPolicy; at most tuning::kWorkWaitSpin).
  void set_helper(std::weak_ptr<Helper> helper, std::chrono::nanoseconds spin) {
    helper_ = std::move(helper);
    spin_ = std::min<std::chrono::nanoseconds>(spin, tuning::kWorkWaitSpin);
  }

 private:
  static constexpr int kPending = 0, kSucceeded = 1, kFailed = 2;
  void finish(int state);
  bool block_until_done(std::chrono::steady_clock::time_point deadline);
  void rethrow_if_failed() const;

  std::optional<Fingerprint> fingerprint_;  // set: description_ is written from it on first use
  mutable std::once_flag described_;
  mutable std::string description_;
  std::atomic<int> state_{kPending};
  std::exception_ptr error_;  // written before state_ becomes kFailed, read after
  std::weak_ptr<Helper> helper_;
  std::chrono::nanoseconds spin_ = tuning::kWorkWaitSpin;
  mutable std::mutex mutex_;
  std::condition_variable done_;
};

using WorkPtr = std::shared_ptr<Work>;

}  // namespace tinyddp::comm
