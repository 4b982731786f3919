// Work: the handle an asynchronous collective returns (PyTorch's c10d::Work).
//
// A collective is queued when it is called and runs later on the process group's communication
// thread, so the caller can go on computing (DDP launches a bucket's all-reduce and keeps running
// the backward pass). Work says when it is done and carries its error, if any:
//
//   auto work = pg->all_reduce(grad);   // returns at once
//   ...                                 // compute overlaps the communication
//   work->wait();                       // blocks until done; rethrows the collective's error
//
// wait() (not wait_for) first offers the waiting thread to the backend (the "helper"): when the
// communication thread has not started the queued collectives yet, the caller runs them itself
// instead of sleeping, which saves two thread hand-offs on every small, immediately awaited
// collective. The ring backend also learns from it which callers wait for each collective before
// the next, and leaves their small collectives to them (RingBackend's Executor).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

namespace tinyddp::comm {

class Work {
 public:
  using Duration = std::chrono::milliseconds;

  explicit Work(std::string description);
  // A Work that is already complete (a collective that had nothing to do, world size 1, ...).
  static std::shared_ptr<Work> completed(std::string description);

  // True once the collective finished, successfully or not. Never blocks.
  bool is_completed() const { return state_.load(std::memory_order_acquire) != kPending; }
  bool is_success() const { return state_.load(std::memory_order_acquire) == kSucceeded; }
  // Blocks until the collective finished; rethrows its error. The collective's own timeout bounds it.
  void wait();
  // Waits at most `timeout`: false if the collective is still running then; rethrows its error.
  bool wait_for(Duration timeout);
  // The error the collective failed with (nullptr while pending or after success).
  std::exception_ptr exception() const;
  // "all_reduce #3 f32[1024] sum": what this work is, for messages and traces.
  const std::string& description() const { return description_; }

  // ---- for backends ----
  void mark_succeeded();
  void mark_failed(std::exception_ptr error);
  // Called by wait() first, done or not (see the header comment).
  void set_helper(std::function<void()> helper) { helper_ = std::move(helper); }

 private:
  static constexpr int kPending = 0, kSucceeded = 1, kFailed = 2;
  void finish(int state);
  bool block_until_done(std::chrono::steady_clock::time_point deadline);
  void rethrow_if_failed() const;

  std::string description_;
  std::atomic<int> state_{kPending};
  std::exception_ptr error_;  // written before state_ becomes kFailed, read after
  std::function<void()> helper_;
  mutable std::mutex mutex_;
  std::condition_variable done_;
};

using WorkPtr = std::shared_ptr<Work>;

}  // namespace tinyddp::comm
