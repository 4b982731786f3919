#include "tinyddp/comm/work.h"

#include "tinyddp/comm/wait_policy.h"

namespace tinyddp::comm {

Work::Work(std::string description) : description_(std::move(description)) {}

Work::Work(const Fingerprint& fingerprint) : fingerprint_(fingerprint) {}

const std::string& Work::description() const {
  if (fingerprint_) std::call_once(described_, [this] { description_ = describe_fingerprint(*fingerprint_); });
  return description_;
}

std::shared_ptr<Work> Work::completed(std::string description) {
  auto work = std::make_shared<Work>(std::move(description));
  work->mark_succeeded();
  return work;
}

void Work::wait() {
  if (auto helper = helper_.lock()) {
    if (!is_completed() && helper->order_after(*this)) {
      rethrow_if_failed();
      return;
    }
    // The helper is told even when the work is done already: it learns from it how the caller waits
    // (see the Executor).
    helper->help(*this);
  }
  block_until_done(std::chrono::steady_clock::time_point::max());
  rethrow_if_failed();
}

void Work::synchronize() {
  if (auto helper = helper_.lock()) helper->help(*this);
  block_until_done(std::chrono::steady_clock::time_point::max());
  rethrow_if_failed();
}

bool Work::wait_for(Duration timeout) {
  // No helping here: a caller that ran the collective itself could not give up at its own timeout.
  bool done = block_until_done(std::chrono::steady_clock::now() + timeout);
  if (done) rethrow_if_failed();
  return done;
}

bool Work::block_until_done(std::chrono::steady_clock::time_point deadline) {
  if (is_completed()) return true;
  // A short spin first (tuning::kWorkWaitSpin at most): a collective that is nearly done finishes
  // sooner than a sleeping thread wakes up. Then sleep, so a waiting caller leaves the core to the
  // ranks that do the work (4 ranks on 2 cores).
  SpinThenSleep spin(spin_);
  while (!is_completed() && spin.keep_spinning()) SpinThenSleep::pause();
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
