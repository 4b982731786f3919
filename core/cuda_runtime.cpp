#include "core/cuda_runtime.h"

#include "core/error.h"

#ifdef TINYDDP_WITH_CUDA
#include <cuda_runtime_api.h>

#include "core/cuda_check.h"
#endif

namespace tinyddp {

#ifdef TINYDDP_WITH_CUDA

namespace {
struct Probe {
  int count = 0;
  std::string reason;
};

// Asked once: cudaGetDeviceCount fails cleanly without a driver (cudaErrorNoDevice,
// cudaErrorInsufficientDriver), which is exactly the case we turn into "zero devices".
const Probe& probe() {
  static const Probe result = [] {
    Probe p;
    cudaError_t err = cudaGetDeviceCount(&p.count);
    if (err != cudaSuccess) {
      cudaGetLastError();  // clear the sticky error so later calls are not poisoned
      p.count = 0;
      if (err == cudaErrorInsufficientDriver)
        p.reason = "the NVIDIA driver is older than this CUDA toolkit needs; hint: update the driver or build with TINYDDP_CUDA=OFF";
      else if (err == cudaErrorNoDevice)
        p.reason = "no CUDA device was found; hint: check nvidia-smi, or use --device cpu";
      else
        p.reason = std::string("the CUDA runtime could not start (") + cudaGetErrorString(err) + "); hint: check nvidia-smi, or use --device cpu";
    } else if (p.count == 0) {
      p.reason = "no CUDA device was found; hint: check nvidia-smi, or use --device cpu";
    }
    return p;
  }();
  return result;
}
}  // namespace

bool cuda_built() { return true; }
int cuda_device_count() { return probe().count; }
std::string cuda_unavailable_reason() { return probe().reason; }

void* cuda_malloc(size_t bytes, int device) {
  cuda_set_device(device);
  void* ptr = nullptr;
  CUDA_CHECK(cudaMalloc(&ptr, bytes));
  return ptr;
}
void cuda_free(void* ptr, int device) {
  cuda_set_device(device);
  CUDA_CHECK(cudaFree(ptr));
}
void* cuda_host_alloc_pinned(size_t bytes) {
  void* ptr = nullptr;
  CUDA_CHECK(cudaHostAlloc(&ptr, bytes, cudaHostAllocDefault));
  return ptr;
}
void cuda_host_free_pinned(void* ptr) { CUDA_CHECK(cudaFreeHost(ptr)); }

void cuda_memcpy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0) return;
  cudaMemcpyKind kind = dst_device.is_cpu() ? (src_device.is_cpu() ? cudaMemcpyHostToHost : cudaMemcpyDeviceToHost)
                                            : (src_device.is_cpu() ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToDevice);
  if (dst_device.is_cuda()) cuda_set_device(dst_device.index);
  else if (src_device.is_cuda()) cuda_set_device(src_device.index);
  CUDA_CHECK(cudaMemcpy(dst, src, bytes, kind));
}
void cuda_memset_zero(void* ptr, size_t bytes, int device) {
  cuda_set_device(device);
  CUDA_CHECK(cudaMemset(ptr, 0, bytes));
}
void cuda_set_device(int device) { CUDA_CHECK(cudaSetDevice(device)); }
void cuda_synchronize(int device) {
  cuda_set_device(device);
  CUDA_CHECK(cudaDeviceSynchronize());
}

#else  // a CPU-only build: the same functions, answering "no CUDA" or refusing clearly.

namespace {
[[noreturn]] void not_built(const char* what) {
  TINYDDP_FAIL(what, " needs CUDA, but this build of tinyddp has no CUDA support; "
               "hint: install the CUDA toolkit (nvcc) and rebuild with TINYDDP_CUDA=AUTO or ON, or use --device cpu");
}
}  // namespace

bool cuda_built() { return false; }
int cuda_device_count() { return 0; }
std::string cuda_unavailable_reason() {
  return "this build of tinyddp has no CUDA support; hint: install the CUDA toolkit (nvcc) and rebuild, or use --device cpu";
}
void* cuda_malloc(size_t, int) { not_built("allocating GPU memory"); }
void cuda_free(void*, int) { not_built("freeing GPU memory"); }
void* cuda_host_alloc_pinned(size_t) { not_built("pinned host memory"); }
void cuda_host_free_pinned(void*) { not_built("pinned host memory"); }
void cuda_memcpy(void*, Device, const void*, Device, size_t) { not_built("copying to or from a GPU"); }
void cuda_memset_zero(void*, size_t, int) { not_built("GPU memset"); }
void cuda_set_device(int) { not_built("selecting a GPU"); }
void cuda_synchronize(int) { not_built("GPU synchronisation"); }

#endif

void require_device(Device device) {
  if (device.is_cpu()) return;
  int count = cuda_device_count();
  TINYDDP_CHECK(count > 0, "device ", device.str(), " was requested but ", cuda_unavailable_reason());
  TINYDDP_CHECK(device.index >= 0 && device.index < count, "device ", device.str(), " does not exist: this machine has ",
                count, " CUDA device(s), cuda:0 to cuda:", count - 1, "; hint: pick one of those, or set CUDA_VISIBLE_DEVICES");
}

}  // namespace tinyddp
