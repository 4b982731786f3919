#include "comm/work.h"

#include <thread>

#include "comm/transport.h"

namespace tinyddp::comm {

Work::Work(std::string description) : description_(std::move(description)) {}

std::shared_ptr<Work> Work::completed(std::string description) {
  auto work = std::make_shared<Work>(std::move(description));
  work->mark_succeeded();
  return work;
}

void Work::wait() {
  block_until_done(std::chrono::steady_clock::time_point::max());
  rethrow_if_failed();
}

bool Work::wait_for(Duration timeout) {
  bool done = block_until_done(std::chrono::steady_clock::now() + timeout);
  if (done) rethrow_if_failed();
  return done;
}

bool Work::block_until_done(std::chrono::steady_clock::time_point deadline) {
  if (is_completed()) return true;
  if (helper_) helper_();
  // A short spin first: a collective that is nearly done finishes sooner than a sleeping thread
  // wakes up (tens of microseconds). Then sleep, so a waiting caller leaves the core to the ranks
  // that do the work (4 ranks on 2 cores).
  SpinThenSleep spin;
  while (!is_completed() && spin.keep_spinning()) spin.pause();
  std::unique_lock<std::mutex> lock(mutex_);
  if (deadline == std::chrono::steady_clock::time_point::max()) {
    done_.wait(lock, [&] { return is_completed(); });
    return true;
  }
  return done_.wait_until(lock, deadline, [&] { return is_completed(); });
}

std::exception_ptr Work::exception() const {
  if (state_.load(std::memory_order_acquire) != kFailed) return nullptr;
  return error_;
}

void Work::rethrow_if_failed() const {
  if (state_.load(std::memory_order_acquire) == kFailed) std::rethrow_exception(error_);
}

void Work::mark_succeeded() { finish(kSucceeded); }

void Work::mark_failed(std::exception_ptr error) {
  error_ = std::move(error);
  finish(kFailed);
}

void Work::finish(int state) {
  {
    // The state changes under the mutex so a waiter cannot check it and then miss the notify.
    std::lock_guard<std::mutex> lock(mutex_);
    state_.store(state, std::memory_order_release);
  }
  done_.notify_all();
}

}  // namespace tinyddp::comm
