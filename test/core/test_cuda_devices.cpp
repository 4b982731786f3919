// Devices without a GPU: what the driver's facts mean (assess_cuda_driver), which device a rank takes
// (device_for_local_rank, default_cuda_device), finding the CUDA half, and fake CUDA devices -- their
// rules, and the allocators' behaviour on them (pinned memory made by a device that has a context,
// small pinned blocks cached, out of memory retried after the cache is returned).
#include <doctest/doctest.h>

#include <stdlib.h>

#include <fstream>
#include <thread>

#include "tinyddp/core/allocator.h"
#include "tinyddp/core/cuda_driver.h"
#include "tinyddp/core/cuda_plugin.h"
#include "tinyddp/core/cuda_runtime.h"
#include "tinyddp/core/random.h"
#include "tinyddp/core/tensor.h"
#include "test/support/fake_cuda.h"
#include "test/test_skip.h"
#include "test/test_support.h"

using namespace tinyddp;

namespace {

CudaDriverFacts working_driver(int version, int devices) {
  CudaDriverFacts f;
  f.library_loaded = true;
  f.kernel_module_loaded = true;
  f.driver_version = version;
  f.device_count = devices;
  return f;
}

// Runs `body` on a new thread: a thread that never selected a CUDA device.
template <typename Fn>
void on_fresh_thread(Fn body) {
  std::exception_ptr error;
  std::thread t([&] {
    try {
      body();
    } catch (...) {
      error = std::current_exception();
    }
  });
  t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace

TEST_CASE("assess_cuda_driver tells no driver, a too-old driver, no device and a working driver apart") {
  CudaDriverFacts none;
  none.library_error = "libcuda.so.1: cannot open shared object file: No such file or directory";
  CudaDriverAssessment a = assess_cuda_driver(none, 13000);
  CHECK(a.device_count == 0);
  CHECK(a.reason.find("no NVIDIA driver found") != std::string::npos);
  CHECK(a.reason.find("cannot open shared object file") != std::string::npos);
  // A library's hint names the API (Device::cpu()), never one program's flag (--device cpu).
  CHECK(a.reason.find("run on the CPU instead (Device::cpu()") != std::string::npos);
  CHECK(a.reason.find("--device") == std::string::npos);

  none.kernel_module_loaded = true;  // a container without the driver's library mounted
  CHECK(assess_cuda_driver(none, 13000).reason.find("kernel driver is loaded, but its library libcuda.so.1") !=
        std::string::npos);

  CudaDriverFacts old = working_driver(12040, 2);
  a = assess_cuda_driver(old, 13000);
  CHECK(a.device_count == 0);
  CHECK(a.reason.find("supports CUDA 12.4, but this build needs CUDA 13.0 or newer") != std::string::npos);
  // Minor version compatibility: a 13.0 driver runs a 13.2 runtime.
  CHECK(assess_cuda_driver(working_driver(13000, 2), 13020).device_count == 2);

  CudaDriverFacts no_device = working_driver(13000, 0);
  no_device.init_result = 100;
  no_device.init_error = "no CUDA-capable device is detected";
  a = assess_cuda_driver(no_device, 13000);
  CHECK(a.device_count == 0);
  CHECK(a.reason.find("no CUDA device was found") != std::string::npos);
  CHECK(a.reason.find("CUDA_VISIBLE_DEVICES") != std::string::npos);

  CudaDriverFacts broken = working_driver(13000, 0);
  broken.init_result = 999;
  broken.init_error = "unknown error";
  CHECK(assess_cuda_driver(broken, 13000).reason.find("could not start (cuInit: unknown error)") != std::string::npos);

  a = assess_cuda_driver(working_driver(13000, 4), 13000);
  CHECK(a.device_count == 4);
  CHECK(a.reason.empty());
}

TEST_CASE("this machine's answer: no NVIDIA driver is said as such, and asking loads no CUDA library") {
  if (cuda_devices_are_fake() || cuda_device_count() > 0) {
    TINYDDP_SKIP("this machine has CUDA devices");
  }
  const std::string reason = cuda_unavailable_reason();
  if (!cuda_built()) {
    CHECK(reason.find("no CUDA support") != std::string::npos);
  } else if (!cuda_driver_facts().library_loaded) {
    CHECK(reason.find("no NVIDIA driver found") != std::string::npos);
  }
  std::ifstream maps("/proc/self/maps");
  std::string text((std::istreambuf_iterator<char>(maps)), std::istreambuf_iterator<char>());
  for (const char* library : {"libcudart", "libcublas", "libnccl", "libtinyddp_cuda", "libtinyddp_nccl"})
    CHECK_MESSAGE(text.find(library) == std::string::npos, library, " is loaded although no GPU was ever used");
}

TEST_CASE("device_for_local_rank: one device per local rank, and what a shorter list means") {
  const std::vector<Device> two{Device::cuda(0), Device::cuda(1)}, reversed{Device::cuda(1), Device::cuda(0)};
  CHECK(device_for_local_rank(two, 1, 2, 2, true, false) == Device::cuda(1));
  // Any list, not only cuda:0..N-1: the list is the rank-to-device map.
  CHECK(device_for_local_rank(reversed, 0, 2, 2, true, false) == Device::cuda(1));
  CHECK(device_for_local_rank({Device::cuda(2), Device::cuda(3)}, 1, 2, 4, true, false) == Device::cuda(3));
  // CPU workers share.
  CHECK(device_for_local_rank({Device::cpu()}, 3, 4, 0, true, false) == Device::cpu());
  // A per-rank CUDA_VISIBLE_DEVICES: each process sees one GPU, its own, as cuda:0.
  CHECK(device_for_local_rank({Device::cuda(0)}, 1, 2, 1, true, true) == Device::cuda(0));
  // Two ranks on one GPU: refused for NCCL, shared for the ring.
  CHECK_THROWS_WITH_AS(device_for_local_rank({Device::cuda(0)}, 1, 2, 2, true, false),
                       doctest::Contains("local rank 1 has no GPU of its own"), Error);
  CHECK(device_for_local_rank({Device::cuda(0)}, 1, 2, 2, false, false) == Device::cuda(0));
  // tinyddp-run -n 2 on a host with one GPU, no CUDA_VISIBLE_DEVICES: each process sees the same GPU.
  CHECK_THROWS_WITH_AS(device_for_local_rank({Device::cuda(0)}, 1, 2, 1, true, false),
                       doctest::Contains("for 2 ranks on this host, which shows 1 GPU(s)"), Error);
  CHECK_THROWS_WITH_AS(device_for_local_rank({Device::cpu(), Device::cuda(0)}, 0, 2, 1, true, false),
                       doctest::Contains("mix the CPU and GPUs"), Error);
  CHECK_THROWS_WITH_AS(device_for_local_rank({}, 0, 1, 0, true, false), doctest::Contains("no devices"), Error);
}

TEST_CASE("default_cuda_device: the local rank's, the rank's, or the only one; never a guess") {
  CHECK(default_cuda_device(1, 5, 4, false) == 1);
  CHECK(default_cuda_device(-1, 2, 4, false) == 2);
  CHECK(default_cuda_device(3, 3, 1, true) == 0);  // per-rank CUDA_VISIBLE_DEVICES
  CHECK_THROWS_WITH_AS(default_cuda_device(3, 3, 2, false),
                       doctest::Contains("local rank 3 has no CUDA device of its own"), Error);
  CHECK_THROWS_WITH_AS(default_cuda_device(-1, 5, 2, false), doctest::Contains("no LOCAL_RANK was set"), Error);
  // tinyddp-run -n 2 on a host with one GPU: local rank 1 is refused here, naming the count.
  CHECK_THROWS_WITH_AS(default_cuda_device(1, 1, 1, false),
                       doctest::Contains("local rank 1 has no CUDA device of its own: this process sees 1 (cuda:0 to "
                                         "cuda:0), CUDA_VISIBLE_DEVICES is not set to give each rank its own"),
                       Error);
}

TEST_CASE("the CUDA half is found beside the build's programs, or where TINYDDP_PLUGIN_DIR says") {
  if (!cuda_built()) {
    TINYDDP_SKIP("this build has no CUDA half");
  }
  CHECK(find_cuda_half(kCudaHalfLibrary).find("/lib/libtinyddp_cuda.so") != std::string::npos);
  testing::TempDir dir;
  std::ofstream(dir.file(kCudaHalfLibrary)) << "not a library";
  ::setenv("TINYDDP_PLUGIN_DIR", dir.path.c_str(), 1);
  CHECK(find_cuda_half(kCudaHalfLibrary) == dir.file(kCudaHalfLibrary));
  std::string searched;
  CHECK(find_cuda_half("libtinyddp_nothing.so", &searched).empty());
  CHECK(searched.find(dir.path.string()) != std::string::npos);
  ::unsetenv("TINYDDP_PLUGIN_DIR");
}

TEST_CASE("fake CUDA: one device per process, and a thread that never selected a device uses cuda:0") {
  FakeCudaDevices devices({.devices = 2});
  FakeCuda& fake = devices.fake();
  CHECK(cuda_device_count() == 2);
  CHECK(cuda_unavailable_reason().empty());
  {
    Tensor mine = Tensor::zeros({16}, DType::f32, Device::cuda(1));
    CHECK(fake.devices_with_context() == std::vector<int>{1});
    CHECK_THROWS_WITH_AS(Tensor::zeros({16}, DType::f32, Device::cuda(0)),
                         doctest::Contains("already has a context on cuda:1"), Error);
    // Raw CUDA on a fresh thread: cudaHostAlloc without a device would create cuda:0's context.
    CHECK_THROWS_WITH_AS(on_fresh_thread([&] { fake.host_alloc_pinned(64); }),
                         doctest::Contains("never selected a device (CUDA then uses cuda:0)"), Error);
    // Through tinyddp's allocator the same thread uses the device that has a context already.
    on_fresh_thread([&] {
      Tensor pinned = Tensor::empty_pinned({1000});
      CHECK(pinned.storage()->pinned());
    });
    CHECK(fake.devices_with_context() == std::vector<int>{1});
    // Host memory passed as device memory fails as it would on a GPU.
    Tensor host = Tensor::zeros({16});
    CHECK_THROWS_WITH_AS(cuda_memcpy(host.raw_data(), Device::cuda(1), mine.raw_data(), Device::cpu(), 64),
                         doctest::Contains("passed as memory of cuda:1 but is not device memory"), Error);
  }
}

TEST_CASE("fake CUDA: tensors move, kernels run the CPU loops, fill_uniform draws the CPU's numbers") {
  FakeCudaDevices devices({.devices = 1});
  {
    Tensor cpu = Tensor::empty({257});
    Generator a(5), b(5);
    fill_uniform(cpu, -1.f, 1.f, a);
    Tensor gpu = Tensor::empty({257}, DType::f32, Device::cuda(0));
    fill_uniform(gpu, -1.f, 1.f, b);
    CHECK(gpu.device() == Device::cuda(0));
    CHECK(gpu.to_vector<float>() == cpu.to_vector<float>());
    CHECK(bitwise_equal(gpu.to(Device::cpu()), cpu));
  }
  cuda_cache_release();
  CHECK(devices.fake().live_device_allocations() == 0);
}

TEST_CASE("small pinned blocks are cached: a staging buffer freed and made again costs one cudaHostAlloc") {
  FakeCudaDevices devices({.devices = 1});
  cuda_set_device(0);
  Tensor on_gpu = Tensor::zeros({4}, DType::f32, Device::cuda(0));  // from now on CPU memory is pinned
  const size_t before = devices.fake().pinned_allocations_made();
  for (int i = 0; i < 5; ++i) {
    Tensor staging = Tensor::empty_pinned({100 + i});  // nearby sizes share a block
    CHECK(staging.storage()->pinned());
  }
  CHECK(devices.fake().pinned_allocations_made() == before + 1);
}

TEST_CASE("only what asks for it is pinned: CPU tensors stay ordinary memory once CUDA is in use") {
  FakeCudaDevices devices({.devices = 1});
  cuda_set_device(0);
  cpu_cache_release();
  Tensor before_cuda = Tensor::empty_pinned({64});
  CHECK_FALSE(before_cuda.storage()->pinned());  // no CUDA yet: nothing loads the CUDA runtime for it
  Tensor on_gpu = Tensor::zeros({4}, DType::f32, Device::cuda(0));
  const size_t made = devices.fake().pinned_allocations_made();
  Tensor activations = Tensor::zeros({1 << 16});  // 256 KiB, as a layer's output
  CHECK_FALSE(activations.storage()->pinned());
  CHECK(devices.fake().pinned_allocations_made() == made);

  Tensor batch = Tensor::from_vector<float>({1, 2, 3});
  Tensor pinned = batch.pin_memory();
  CHECK(pinned.storage()->pinned());
  CHECK(pinned.to_vector<float>() == std::vector<float>{1, 2, 3});
  CHECK(pinned.pin_memory().storage() == pinned.storage());  // pinned already: the same tensor
  CHECK(devices.fake().pinned_allocations_made() == made + 1);
  CHECK_THROWS_WITH_AS(on_gpu.pin_memory(), doctest::Contains("is not a CPU tensor"), Error);

  // A large pinned block is rounded to 2 MiB, not to the next power of two (5 MiB + 4 bytes: 6 MiB, not 8).
  cpu_cache_release();
  { Tensor staging = Tensor::empty_pinned({(int64_t(5) << 20 >> 2) + 1}); }
  CHECK(cpu_cache_stats().bytes_cached == size_t(6) << 20);
  cpu_cache_release();
}

TEST_CASE("a failed cudaFreeHost in a tensor's destructor is logged once, never thrown") {
  FakeCudaDevices devices({.devices = 1});
  cuda_set_device(0);
  Tensor on_gpu = Tensor::zeros({4}, DType::f32, Device::cuda(0));
  testing::CapturedStderr captured;
  devices.fake().fail_host_frees("cudaErrorIllegalAddress (a sticky error)");
  // Larger than the pinned cache keeps (256 MiB): freed at once, with cudaFreeHost. Never touched, so
  // the fake's host memory for it is only reserved. Both blocks are given up, as after a real sticky
  // error: the fake says at its end that 2 allocations outlived it.
  for (int i = 0; i < 2; ++i) {
    CHECK_NOTHROW({ Tensor staging = Tensor::empty_pinned({int64_t(300) << 20 >> 2}); });
  }
  devices.fake().fail_host_frees("");
  const std::string text = captured.text();
  CHECK(text.find("freeing memory failed; this and later failed frees are given up: ") != std::string::npos);
  CHECK(text.find("fake CUDA: cudaFreeHost(") != std::string::npos);
  CHECK(text.find("cudaErrorIllegalAddress (a sticky error)") != std::string::npos);
  CHECK(text.find("freeing memory failed") == text.rfind("freeing memory failed"));  // once
}

TEST_CASE("CUDA out of memory: the cached blocks go back to the device and the allocation is retried once") {
  FakeCudaDevices devices({.devices = 1, .memory_per_device = size_t(5) << 20});
  {
    { Tensor big = Tensor::empty({int64_t(2) << 20 >> 2}, DType::f32, Device::cuda(0)); }  // 2 MiB, now cached
    CHECK(cuda_cache_stats(0).bytes_cached == size_t(2) << 20);
    // 4 MiB (2 MiB and 4 bytes, rounded) do not fit beside the cached block: the cache is emptied and
    // the retry succeeds.
    Tensor other = Tensor::empty({(int64_t(2) << 20 >> 2) + 1}, DType::f32, Device::cuda(0));
    CHECK(cuda_cache_stats(0).bytes_cached == 0);
    CHECK_THROWS_WITH_AS(Tensor::empty({int64_t(2) << 20 >> 2}, DType::f32, Device::cuda(0)),
                         doctest::Contains("out of memory on cuda:0"), Error);
  }
}
