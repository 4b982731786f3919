// A fake CUDA stream: a queue of work that a thread of its own runs later, in order, as a GPU runs the
// kernels a host thread launched on a stream. It is what makes the fake devices asynchronous, so that
// a missing cudaStreamWaitEvent, a host read that skips a synchronisation or a buffer reused too early
// shows up in a test instead of on the first GPU run:
//   - enqueue() returns at once; the work runs on the stream's thread after `launch_delay`;
//   - the device memory a queued piece of work writes is poisoned (every byte 0xFF: NaN as a float,
//     -1 as an integer) from the moment the stream reaches it until it runs. The true bytes are kept
//     aside and put back just before the work runs, so work on the same stream, and work ordered after
//     it by an event, never sees the poison; only a reader that skipped the ordering does;
//   - an event recorded on the stream completes when the stream reaches it; a stream told to wait for an
//     event holds its later work back until the event completes, on whatever stream it was recorded.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace tinyddp {

// Device memory a queued piece of work writes: poisoned until the work runs.
struct WrittenRange {
  void* ptr;
  size_t bytes;
};

// What cudaEventRecord and cudaEventQuery see: the n-th record of an event is done when its stream
// reaches it. A never-recorded event is done, as in CUDA.
struct FakeEventState {
  std::mutex mutex;
  std::condition_variable changed;
  uint64_t recorded = 0;
  uint64_t completed = 0;
};

class FakeStreamQueue {
 public:
  // `on_start` runs first on the stream's thread (the fake selects the stream's device there).
  FakeStreamQueue(int device, std::chrono::microseconds launch_delay, std::function<void()> on_start);
  // Runs what is queued, then ends the thread.
  ~FakeStreamQueue();
  FakeStreamQueue(const FakeStreamQueue&) = delete;
  FakeStreamQueue& operator=(const FakeStreamQueue&) = delete;

  int device() const { return device_; }
  // Queues `work`, which writes `writes`; `what` names it in errors.
  void enqueue(std::string what, std::vector<WrittenRange> writes, std::function<void()> work);
  // Queues the completion of the event's next record.
  void record(const std::shared_ptr<FakeEventState>& event);
  // Queues a wait for the event's latest record (a no-op when it has none).
  void wait_for(const std::shared_ptr<FakeEventState>& event);
  // Blocks the calling thread until everything queued so far has run (cudaStreamSynchronize).
  void drain();
  // The first exception a piece of work threw, "" when none did (a fault of the fake's own checks).
  std::string first_error() const;

 private:
  struct Task {
    std::string what;
    std::vector<WrittenRange> writes;
    std::function<void()> work;
    std::vector<std::vector<unsigned char>> kept;  // the true bytes of `writes` while poisoned
    bool poisoned = false;
  };
  static void poison(Task& task);
  static void unpoison(Task& task);
  void run();

  const int device_;
  const std::chrono::microseconds launch_delay_;
  std::function<void()> on_start_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Task> queue_;
  uint64_t enqueued_ = 0, finished_ = 0;
  bool running_ = false;  // the thread is inside a piece of work
  bool stop_ = false;
  std::string first_error_;
  std::thread thread_;
};

}  // namespace tinyddp
