#include "test/support/fake_stream.h"

#include <cstring>
#include <exception>

namespace tinyddp {

FakeStreamQueue::FakeStreamQueue(int device, std::chrono::microseconds launch_delay, std::function<void()> on_start)
    : device_(device), launch_delay_(launch_delay), on_start_(std::move(on_start)) {
  thread_ = std::thread([this] { run(); });
}

FakeStreamQueue::~FakeStreamQueue() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void FakeStreamQueue::poison(Task& task) {
  if (task.poisoned) return;
  for (const WrittenRange& range : task.writes) {
    auto* bytes = static_cast<unsigned char*>(range.ptr);
    task.kept.emplace_back(bytes, bytes + range.bytes);
    std::memset(bytes, 0xFF, range.bytes);
  }
  task.poisoned = true;
}

void FakeStreamQueue::unpoison(Task& task) {
  for (size_t i = 0; i < task.kept.size(); ++i)
    std::memcpy(task.writes[i].ptr, task.kept[i].data(), task.kept[i].size());
  task.kept.clear();
}

void FakeStreamQueue::enqueue(std::string what, std::vector<WrittenRange> writes, std::function<void()> work) {
  std::lock_guard<std::mutex> lock(mutex_);
  Task task{std::move(what), std::move(writes), std::move(work), {}, false};
  // The stream has reached this work already when nothing is ahead of it: poison now, so that even a
  // reader that runs before the stream's thread wakes up sees it.
  if (queue_.empty() && !running_) poison(task);
  queue_.push_back(std::move(task));
  ++enqueued_;
  changed_.notify_all();
}

void FakeStreamQueue::record(const std::shared_ptr<FakeEventState>& event) {
  uint64_t generation = 0;
  {
    std::lock_guard<std::mutex> lock(event->mutex);
    generation = ++event->recorded;
  }
  enqueue("cudaEventRecord", {}, [event, generation] {
    std::lock_guard<std::mutex> lock(event->mutex);
    if (event->completed < generation) event->completed = generation;
    event->changed.notify_all();
  });
}

void FakeStreamQueue::wait_for(const std::shared_ptr<FakeEventState>& event) {
  uint64_t generation = 0;
  {
    std::lock_guard<std::mutex> lock(event->mutex);
    generation = event->recorded;
  }
  if (generation == 0) return;
  enqueue("cudaStreamWaitEvent", {}, [event, generation] {
    std::unique_lock<std::mutex> lock(event->mutex);
    event->changed.wait(lock, [&] { return event->completed >= generation; });
  });
}

void FakeStreamQueue::drain() {
  std::unique_lock<std::mutex> lock(mutex_);
  const uint64_t target = enqueued_;
  changed_.wait(lock, [&] { return finished_ >= target; });
}

std::string FakeStreamQueue::first_error() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return first_error_;
}

void FakeStreamQueue::run() {
  if (on_start_) on_start_();
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and everything queued has run
    Task task = std::move(queue_.front());
    queue_.pop_front();
    running_ = true;
    poison(task);  // the stream has reached it
    lock.unlock();
    if (launch_delay_.count() > 0 && !task.writes.empty()) std::this_thread::sleep_for(launch_delay_);
    unpoison(task);
    try {
      task.work();
    } catch (const std::exception& e) {
      lock.lock();
      if (first_error_.empty()) first_error_ = task.what + ": " + e.what();
      lock.unlock();
    }
    lock.lock();
    running_ = false;
    ++finished_;
    changed_.notify_all();
  }
}

}  // namespace tinyddp
