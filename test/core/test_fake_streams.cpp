// The fake devices are asynchronous as a GPU is (test/support/fake_stream.h): work queued on a stream
// runs later, in order; what it writes reads as poison until then; events complete when their stream
// reaches them; cudaStreamWaitEvent orders two streams; and the calls that create a context on a GPU
// create one here. These are the properties the suites on fake devices rely on to catch a missing wait.
#include <doctest/doctest.h>

#include <cmath>
#include <thread>

#include "tinyddp/core/cuda_runtime.h"
#include "tinyddp/core/tensor.h"
#include "tinyddp/kernels/ops.h"
#include "test/support/fake_cuda.h"

using namespace tinyddp;

namespace {

// A delay long enough that a host thread reads a queued write's memory before the stream runs it,
// even on a loaded machine.
constexpr std::chrono::microseconds kSlowLaunch{200'000};

float first_float(const void* device_memory) { return *static_cast<const float*>(device_memory); }

}  // namespace

TEST_CASE("fake streams: a kernel's output reads as poison until its stream runs it, then as its result") {
  FakeCudaDevices devices({.devices = 1, .launch_delay = kSlowLaunch});
  cuda_set_device(0);
  {
    Tensor t = Tensor::zeros({64}, DType::f32, Device::cuda(0));
    cuda_synchronize(0);
    CHECK(first_float(t.raw_data()) == 0.f);
    kernels::fill(t, 3.f);                                       // returns at once, as a launch does
    CHECK(std::isnan(first_float(t.raw_data())));                // a host read that skipped the synchronisation
    CHECK(t.to_vector<float>() == std::vector<float>(64, 3.f));  // cudaMemcpy waits for the default stream
    // In-place work on one stream sees the true values, not the poison of its own output.
    kernels::scale(t, 2.f);
    kernels::axpy(1.f, t, t);
    CHECK(t.to_vector<float>() == std::vector<float>(64, 12.f));
  }
  cuda_cache_release();
}

TEST_CASE("fake streams: an event completes when its stream reaches it, and a stream waiting on it is ordered after") {
  FakeCudaDevices devices({.devices = 1, .launch_delay = kSlowLaunch});
  FakeCuda& fake = devices.fake();
  cuda_set_device(0);
  {
    Tensor t = Tensor::zeros({4}, DType::f32, Device::cuda(0));
    cuda_synchronize(0);
    CudaStream producer = fake.create_stream(0), consumer = fake.create_stream(0);
    CudaEvent written = fake.create_event(0);
    CHECK(fake.query_event(written, nullptr) == CudaEventState::done);  // never recorded
    float* p = t.data<float>();
    auto write = [&](float value) { fake.launch(producer, "write", {{p, 16}}, [p, value] { p[0] = value; }); };
    auto read_on_consumer = [&](float* seen) { fake.launch(consumer, "read", {}, [p, seen] { *seen = p[0]; }); };

    // Ordered: the consumer waits for the event recorded after the write.
    write(5.f);
    fake.record_event(written, producer);
    CHECK(fake.query_event(written, nullptr) == CudaEventState::pending);
    fake.stream_wait_event(consumer, written);
    float ordered = 0.f;
    read_on_consumer(&ordered);
    fake.synchronize(0);
    CHECK(ordered == 5.f);
    CHECK(fake.query_event(written, nullptr) == CudaEventState::done);

    // Not ordered: the consumer runs while the write is still queued, and reads the poison.
    write(7.f);
    float unordered = 0.f;
    read_on_consumer(&unordered);
    fake.synchronize(0);
    CHECK(std::isnan(unordered));
    CHECK(first_float(p) == 7.f);

    fake.destroy_event(written);
    fake.destroy_stream(producer);
    fake.destroy_stream(consumer);
  }
  cuda_cache_release();
}

TEST_CASE("fake streams: recording an event on a thread that never selected a device creates cuda:0's context") {
  FakeCudaDevices devices({.devices = 2});
  FakeCuda& fake = devices.fake();
  cuda_set_device(1);
  CudaEvent event = fake.create_event(1);
  CHECK(fake.query_event(event, nullptr) == CudaEventState::done);
  CHECK(fake.devices_with_context() == std::vector<int>{1});
  std::string error;
  std::thread([&] {
    try {
      fake.record_event(event, nullptr);  // the legacy default stream of this thread's device: cuda:0
    } catch (const std::exception& e) {
      error = e.what();
    }
  }).join();
  CHECK(error.find("cudaEventRecord on a thread that never selected a device") != std::string::npos);
  CHECK(fake.devices_with_context() == std::vector<int>{1});
  fake.destroy_event(event);
}

TEST_CASE("free memory asked on a thread that never selected a device creates a context on that device only") {
  // The contexts per device, counted by the fake: cudaMemGetInfo on cuda:1 from a fresh thread must not
  // leave a context on cuda:0 behind (switching "back" to the thread's default device would).
  FakeCudaDevices devices({.devices = 2});
  FakeCuda& fake = devices.fake();
  cuda_set_device(1);
  CHECK(fake.devices_with_context() == std::vector<int>{1});
  std::string error;
  int selected_after = -2;
  std::thread([&] {
    try {
      CHECK(fake.thread_selected_device() == -1);
      CHECK(cuda_free_memory(1) > 0);
      selected_after = fake.thread_selected_device();
    } catch (const std::exception& e) {
      error = e.what();
    }
  }).join();
  CHECK(error == "");
  CHECK(selected_after == 1);  // the device asked about, which has the process's context anyway
  CHECK(fake.devices_with_context() == std::vector<int>{1});
  // A thread that had selected a device keeps it.
  CHECK(cuda_free_memory(1) > 0);
  CHECK(fake.thread_selected_device() == 1);
}
