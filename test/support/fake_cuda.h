// Fake CUDA devices: "cuda:N" tensors on a machine without a GPU, with the rules of real devices
// enforced, so that the code that decides where memory lives is tested where there is no GPU.
//
// Their memory is ordinary host memory (the kernels run their CPU loops on it; see
// kernels/cuda_dispatch.h), but everything else behaves as CUDA does, and strictly:
//   - every thread has a current device; a thread that never selected one uses cuda:0, as CUDA's
//     runtime does, and that creates a context on cuda:0 (a CUDA context costs a few hundred MB of
//     GPU memory, and in exclusive-process mode a second process cannot create one at all);
//   - "one device per process" (on by default): the first device a process touches is its device; a
//     context on any other device is an error naming what created each, at the call that creates it.
//     That is the rule of a data-parallel job (one process per GPU), and what catches a rank that
//     allocates on cuda:0 before it knows its own device;
//   - device memory belongs to one device: a copy, a memset, a free or a collective handed a pointer
//     of another device (or of the host) fails as it would on a GPU;
//   - a device has a memory limit when one is set, and malloc then answers "out of memory";
//   - work is asynchronous (test/support/fake_stream.h): kernels, memsets, device-to-device copies and
//     fake NCCL's collectives queue on a stream that a thread of its own runs later, in order, with the
//     memory they write poisoned until they run; events complete when their stream reaches them and
//     cudaStreamWaitEvent really orders two streams. Host-to-device and device-to-host copies wait for
//     the device's default stream, as cudaMemcpy does; the nccl backend's stream is non-blocking (it
//     is not ordered after the default stream unless it waits on an event), as the real one is.
// The fake NCCL library (test/support/fake_nccl.h) reads this bookkeeping to enforce NCCL's own rules.
//
// They live in the test-support library (tinyddp_fakes), which the tests, their helper programs and
// the examples built in the tree link; the libraries a user links hold none of this, and core finds the
// fakes only through the finder this file registers (set_cuda_stand_in_finder, core/cuda_runtime.h).
//
// Two ways to have them: TINYDDP_FAKE_CUDA_DEVICES=N in the environment (read at the first CUDA call;
// child processes inherit it, so MultiDevice's spawned workers see the same devices), or a
// FakeCudaDevices object in a test, which installs them for its lifetime.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tinyddp/core/cuda_api.h"
#include "tinyddp/core/cuda_runtime.h"
#include "test/support/fake_stream.h"

namespace tinyddp {

struct FakeCudaOptions {
  int devices = 2;
  // Off for tests that run several ranks as threads of one process, each on its own device.
  bool one_device_per_process = true;
  size_t memory_per_device = 0;  // bytes; 0: no limit
  // How long a stream holds a piece of work that writes memory (poisoned meanwhile) before running it:
  // the window in which a reader that skipped a synchronisation reads the poison.
  std::chrono::microseconds launch_delay{100};
};

class FakeCuda final : public CudaStandIn {
 public:
  explicit FakeCuda(FakeCudaOptions options);
  ~FakeCuda() override;

  std::string describe() const override;
  bool is_fake() const override { return true; }
  void* malloc(size_t bytes, int device) override;
  void free(void* ptr, int device) override;
  void* host_alloc_pinned(size_t bytes) override;
  void host_free_pinned(void* ptr) override;
  void memcpy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) override;
  void memset_zero(void* ptr, size_t bytes, int device) override;
  void set_device(int device) override;
  int current_device() override;
  int thread_selected_device() override;
  void synchronize(int device) override;
  void memory_info(int device, size_t* free_bytes, size_t* total_bytes) override;
  CudaStream create_stream(int device) override;
  void destroy_stream(CudaStream stream) override;
  CudaEvent create_event(int device) override;
  void destroy_event(CudaEvent event) override;
  void record_event(CudaEvent event, CudaStream stream) override;
  void stream_wait_event(CudaStream stream, CudaEvent event) override;
  CudaEventState query_event(CudaEvent event, std::string* error) override;
  void fill_uniform(float* out, int64_t n, uint64_t seed, uint64_t offset, float lo, float hi, int device) override;

  // ---- the bookkeeping, for fake NCCL and for tests ----
  int device_count() const override { return options_.devices; }
  // The device whose allocation holds all of [ptr, ptr + bytes); -1 for anything else (host memory,
  // freed memory, a range running past the end of its allocation).
  int device_of(const void* ptr, size_t bytes) const;
  bool has_context(int device) const override;
  std::vector<int> devices_with_context() const override;
  // What created the context on `device` ("" when there is none), for error messages.
  std::string context_origin(int device) const;
  size_t live_device_allocations() const;
  size_t live_pinned_allocations() const;
  size_t pinned_allocations_made() const;  // host_alloc_pinned calls so far
  // From now on cudaFreeHost fails with `error` (a sticky error: the device is lost); "" heals it.
  void fail_host_frees(std::string error);
  // The device a stream of this fake belongs to (the calling thread's device for the default stream).
  int stream_device(CudaStream stream) const;
  // Runs `operation` as the context-creating call it describes: checks the one-device rule and
  // records the context. For fake NCCL (ncclCommInitRank creates a context on its device).
  void touch(int device, const std::string& operation);
  // Queues `work`, which writes `writes`, on `stream` (null: the calling thread's device's default
  // stream). The fake kernels (fake_kernels.cpp) and fake NCCL launch through this.
  void launch(CudaStream stream, std::string what, std::vector<WrittenRange> writes, std::function<void()> work);
  void launch_on_device(int device, std::string what, std::vector<WrittenRange> writes, std::function<void()> work);
  // Waits until the device's default stream has run everything queued on it so far.
  void synchronize_default_stream(int device);

 private:
  struct Block {
    size_t bytes;
    int device;  // -1: pinned host memory
  };
  bool thread_chose_device() const;  // the calling thread set a device on this instance
  int thread_device() const;         // the calling thread's current device (0 if it never set one)
  void check_device(int device, const char* call) const;
  void select(int device, const std::string& operation);
  void check_range(const void* ptr, size_t bytes, int device, const char* call, const char* role) const;
  void touch_locked(int device, const std::string& operation);
  FakeStreamQueue& default_stream(int device);
  FakeStreamQueue& queue_of(CudaStream stream);
  std::unique_ptr<FakeStreamQueue> make_queue(int device);

  FakeCudaOptions options_;
  const uint64_t instance_;
  mutable std::mutex mutex_;
  std::map<const char*, Block> blocks_;  // by start address
  std::map<int, std::string> contexts_;  // device -> what created its context
  std::vector<size_t> bytes_in_use_;     // per device
  size_t pinned_made_ = 0;
  std::string host_free_error_;                                    // fail_host_frees
  std::mutex streams_mutex_;                                       // default_streams_, streams_
  std::vector<std::unique_ptr<FakeStreamQueue>> default_streams_;  // per device, made at first use
  std::vector<FakeStreamQueue*> streams_;                          // made by create_stream, still alive
};

// The fake devices in use, or nullptr: a FakeCudaDevices object's, else TINYDDP_FAKE_CUDA_DEVICES's.
FakeCuda* active_fake_cuda();

// Fake devices for the lifetime of this object (tests). On destruction it returns the blocks that
// the caching allocators still hold to the fake, turns pinned CPU memory off again, and removes the
// devices: every tensor on them must be gone by then. Also sets TINYDDP_FAKE_CUDA_DEVICES (restored
// afterwards) so that processes this test starts see the same devices.
class FakeCudaDevices {
 public:
  explicit FakeCudaDevices(FakeCudaOptions options = {});
  ~FakeCudaDevices();
  FakeCudaDevices(const FakeCudaDevices&) = delete;
  FakeCudaDevices& operator=(const FakeCudaDevices&) = delete;
  FakeCuda& fake() { return *fake_; }

 private:
  std::unique_ptr<FakeCuda> fake_;
  std::string previous_environment_;
  bool had_environment_ = false;
};

}  // namespace tinyddp
