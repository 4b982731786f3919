// The real CudaApi (core/cuda_api.h): thin calls into the CUDA runtime, inside libtinyddp_cuda.so.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include "tinyddp/core/cuda_api.h"
#include "tinyddp/core/cuda_check.h"

namespace tinyddp::cuda {

void fill_uniform(float* out, int64_t n, uint64_t seed, uint64_t offset, float lo, float hi, int device);  // random.cu

namespace {

class RuntimeApi final : public CudaApi {
 public:
  std::string describe() const override {
    int version = 0;
    cudaRuntimeGetVersion(&version);
    return "CUDA runtime " + std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
  }
  bool is_fake() const override { return false; }

  void* malloc(size_t bytes, int device) override {
    set_device(device);
    void* ptr = nullptr;
    cudaError_t status = cudaMalloc(&ptr, bytes);
    if (status == cudaErrorMemoryAllocation) {
      // Not sticky, but it stays the thread's "last error": clear it, or the next kernel launch's
      // check (cudaGetLastError) would report this allocation's failure as its own.
      cudaGetLastError();
      return nullptr;
    }
    CUDA_CHECK(status);
    return ptr;
  }
  void free(void* ptr, int device) override {
    set_device(device);
    CUDA_CHECK(cudaFree(ptr));
  }
  void* host_alloc_pinned(size_t bytes) override {
    void* ptr = nullptr;
    CUDA_CHECK(cudaHostAlloc(&ptr, bytes, cudaHostAllocDefault));
    return ptr;
  }
  void host_free_pinned(void* ptr) override { CUDA_CHECK(cudaFreeHost(ptr)); }

  void memcpy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) override {
    if (bytes == 0) return;
    cudaMemcpyKind kind = dst_device.is_cpu()
                              ? (src_device.is_cpu() ? cudaMemcpyHostToHost : cudaMemcpyDeviceToHost)
                              : (src_device.is_cpu() ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToDevice);
    set_device(dst_device.is_cuda() ? dst_device.index : src_device.index);
    CUDA_CHECK(cudaMemcpy(dst, src, bytes, kind));
  }
  void memset_zero(void* ptr, size_t bytes, int device) override {
    set_device(device);
    CUDA_CHECK(cudaMemset(ptr, 0, bytes));
  }

  // Also creates the device's primary context when it has none (CUDA 12 and newer).
  void set_device(int device) override { CUDA_CHECK(cudaSetDevice(device)); }
  int current_device() override {
    int device = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    return device;
  }
  void synchronize(int device) override {
    set_device(device);
    CUDA_CHECK(cudaDeviceSynchronize());
  }
  int thread_selected_device() override {
    // The runtime answers cudaGetDevice with 0 on a thread that never selected a device; only the
    // driver tells whether the thread has a current context. Its entry point comes through the runtime,
    // so this half links no libcuda of its own.
    using GetCurrent = CUresult (*)(CUcontext*);
    static const GetCurrent get_current = [] {
      void* fn = nullptr;
      cudaDriverEntryPointQueryResult found{};
      if (cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &fn, 12000, cudaEnableDefault, &found) != cudaSuccess ||
          found != cudaDriverEntryPointSuccess)
        fn = nullptr;
      return reinterpret_cast<GetCurrent>(fn);
    }();
    CUcontext context = nullptr;
    if (get_current == nullptr || get_current(&context) != CUDA_SUCCESS || context == nullptr) return -1;
    return current_device();
  }
  void memory_info(int device, size_t* free_bytes, size_t* total_bytes) override {
    set_device(device);
    CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
  }

  CudaStream create_stream(int device) override {
    set_device(device);
    cudaStream_t stream = nullptr;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    return stream;
  }
  void destroy_stream(CudaStream stream) override { CUDA_CHECK(cudaStreamDestroy(static_cast<cudaStream_t>(stream))); }
  CudaEvent create_event(int device) override {
    set_device(device);
    cudaEvent_t event = nullptr;
    CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    return event;
  }
  void destroy_event(CudaEvent event) override { CUDA_CHECK(cudaEventDestroy(static_cast<cudaEvent_t>(event))); }
  void record_event(CudaEvent event, CudaStream stream) override {
    CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event),
                               stream ? static_cast<cudaStream_t>(stream) : cudaStreamLegacy));
  }
  void stream_wait_event(CudaStream stream, CudaEvent event) override {
    CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0));
  }
  CudaEventState query_event(CudaEvent event, std::string* error) override {
    cudaError_t state = cudaEventQuery(static_cast<cudaEvent_t>(event));
    if (state == cudaSuccess) return CudaEventState::done;
    if (state == cudaErrorNotReady) return CudaEventState::pending;
    if (error) *error = std::string(cudaGetErrorName(state)) + " (" + cudaGetErrorString(state) + ")";
    return CudaEventState::failed;
  }

  void fill_uniform(float* out, int64_t n, uint64_t seed, uint64_t offset, float lo, float hi, int device) override {
    cuda::fill_uniform(out, n, seed, offset, lo, hi, device);
  }
};

}  // namespace
}  // namespace tinyddp::cuda

extern "C" __attribute__((visibility("default"))) tinyddp::CudaApi* tinyddp_cuda_api(int abi) {
  static tinyddp::cuda::RuntimeApi api;
  return abi == tinyddp::kCudaPluginAbi ? &api : nullptr;
}
