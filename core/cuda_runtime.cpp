#include "tinyddp/core/cuda_runtime.h"

#include <atomic>

#include "tinyddp/core/cuda_driver.h"
#include "tinyddp/core/cuda_plugin.h"
#include "tinyddp/core/error.h"

namespace tinyddp {

namespace {

std::atomic<CudaStandInFinder> g_stand_in_finder{nullptr};

CudaStandIn* stand_in() {
  CudaStandInFinder finder = g_stand_in_finder.load(std::memory_order_acquire);
  return finder ? finder() : nullptr;
}

struct Availability {
  int device_count = 0;
  std::string reason;
};

// The real devices, decided once: the driver first (so that a machine without one hears "no NVIDIA
// driver found"), then whether the CUDA half is there to use them.
const Availability& real_devices() {
  static const Availability result = [] {
    Availability a;
#ifndef TINYDDP_WITH_CUDA
    a.reason =
        "this build of tinyddp has no CUDA support; hint: install the CUDA toolkit (nvcc) and rebuild with "
        "TINYDDP_CUDA=AUTO or ON, or run on the CPU instead (Device::cpu())";
#else
    CudaDriverAssessment driver = assess_cuda_driver(cuda_driver_facts(), TINYDDP_CUDA_TOOLKIT_VERSION);
    a.device_count = driver.device_count;
    a.reason = driver.reason;
    std::string searched;
    if (a.device_count > 0 && find_cuda_half(kCudaHalfLibrary, &searched).empty()) {
      a.device_count = 0;
      a.reason = std::string("the GPUs cannot be used: tinyddp's CUDA half ") + kCudaHalfLibrary +
                 " was not found (looked in " + searched +
                 "); hint: keep it in the program's folder or in ../lib beside it, or set TINYDDP_PLUGIN_DIR";
    }
#endif
    return a;
  }();
  return result;
}

CudaApi& cuda_half() {
#ifdef TINYDDP_WITH_CUDA
  // Loaded on the first call; when loading throws, the next call tries again (and says why again).
  static CudaApi* const api = cuda_half_interface<CudaApi>(kCudaHalfLibrary, kCudaApiEntryName);
  return *api;
#else
  TINYDDP_FAIL("CUDA was requested, but ", real_devices().reason);
#endif
}

bool context_active(int device) {
  if (CudaStandIn* fake = stand_in()) return fake->has_context(device);
  return cuda_primary_context_active(device);
}

// Makes the calling thread's current device one that has a context already, unless its own has one
// (see cuda_host_alloc_pinned in the header). With no context anywhere, the thread's device it is.
void select_device_with_context(CudaApi& api) {
  if (context_active(api.current_device())) return;
  const int count = cuda_device_count();
  for (int device = 0; device < count; ++device) {
    if (context_active(device)) {
      api.set_device(device);
      return;
    }
  }
}

}  // namespace

void set_cuda_stand_in_finder(CudaStandInFinder finder) { g_stand_in_finder.store(finder, std::memory_order_release); }

bool cuda_built() {
#ifdef TINYDDP_WITH_CUDA
  return true;
#else
  return false;
#endif
}

bool cuda_devices_are_fake() { return stand_in() != nullptr; }

int cuda_device_count() {
  if (CudaStandIn* fake = stand_in()) return fake->device_count();
  return real_devices().device_count;
}

std::string cuda_unavailable_reason() {
  if (stand_in()) return "";
  return real_devices().reason;
}

CudaApi& cuda_api() {
  if (CudaStandIn* fake = stand_in()) return *fake;
  TINYDDP_CHECK(real_devices().device_count > 0, "a CUDA device was requested, but ", real_devices().reason);
  return cuda_half();
}

std::vector<int> cuda_devices_with_context() {
  if (CudaStandIn* fake = stand_in()) return fake->devices_with_context();
  std::vector<int> devices;
  for (int device = 0; device < real_devices().device_count; ++device)
    if (cuda_primary_context_active(device)) devices.push_back(device);
  return devices;
}

void require_device(Device device) {
  if (device.is_cpu()) return;
  int count = cuda_device_count();
  TINYDDP_CHECK(count > 0, "device ", device.str(), " was requested but ", cuda_unavailable_reason());
  TINYDDP_CHECK(device.index >= 0 && device.index < count, "device ", device.str(),
                " does not exist: this machine has ", count, " CUDA device(s), cuda:0 to cuda:", count - 1,
                hint("pick one of those, or set CUDA_VISIBLE_DEVICES"));
}

void* cuda_malloc(size_t bytes, int device) { return cuda_api().malloc(bytes, device); }
void cuda_free(void* ptr, int device) { cuda_api().free(ptr, device); }

void* cuda_host_alloc_pinned(size_t bytes) {
  CudaApi& api = cuda_api();
  select_device_with_context(api);
  return api.host_alloc_pinned(bytes);
}

void cuda_host_free_pinned(void* ptr) {
  CudaApi& api = cuda_api();
  select_device_with_context(api);
  api.host_free_pinned(ptr);
}

void cuda_memcpy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0) return;
  cuda_api().memcpy(dst, dst_device, src, src_device, bytes);
}

void cuda_memset_zero(void* ptr, size_t bytes, int device) { cuda_api().memset_zero(ptr, bytes, device); }
void cuda_set_device(int device) { cuda_api().set_device(device); }
int cuda_current_device() { return cuda_api().current_device(); }
void cuda_synchronize(int device) { cuda_api().synchronize(device); }
// cudaMemGetInfo answers for the current device. The thread's own device is put back afterwards, but
// only one it had selected: a thread that never selected one (a launcher's, a perf program's before it
// sets its device) would otherwise get a context on cuda:0, hundreds of MB of another rank's GPU.
size_t cuda_free_memory(int device) {
  CudaApi& api = cuda_api();
  const int selected = api.thread_selected_device();
  size_t free_bytes = 0, total_bytes = 0;
  api.memory_info(device, &free_bytes, &total_bytes);
  if (selected >= 0 && selected != device) api.set_device(selected);
  return free_bytes;
}

}  // namespace tinyddp
