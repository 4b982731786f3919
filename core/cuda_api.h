// CudaApi: everything tinyddp asks of the CUDA runtime, as one interface with two implementations.
//
//   the CUDA half (core/cuda/cuda_api_impl.cpp, inside libtinyddp_cuda.so): the real runtime, loaded
//       with dlopen the first time a CUDA device is used (core/cuda_plugin.h says why and how);
//   fake devices (test/support/fake_cuda.h): "cuda:N" memory that is ordinary host memory, with CUDA's rules
//       about devices and contexts enforced, so that device logic is tested on machines without a GPU.
//
// Nothing outside core/cuda/ includes a CUDA header: this interface passes plain pointers, and streams
// and events as opaque handles.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tinyddp/core/device.h"

namespace tinyddp {

// cudaStream_t and cudaEvent_t behind opaque pointers. A null stream is the legacy default stream,
// where tinyddp's kernels and copies run.
using CudaStream = void*;
using CudaEvent = void*;

enum class CudaEventState { done, pending, failed };

class CudaApi {
 public:
  virtual ~CudaApi() = default;

  // "CUDA runtime 13.0 (libtinyddp_cuda.so)", or "2 fake CUDA devices".
  virtual std::string describe() const = 0;
  // True for fake devices: their memory is host memory, and kernels run the CPU loops on it.
  virtual bool is_fake() const = 0;

  // Device memory. malloc returns nullptr when the device is out of memory (after clearing CUDA's
  // sticky last error, so the next kernel launch is not blamed for it) and throws on other failures.
  virtual void* malloc(size_t bytes, int device) = 0;
  virtual void free(void* ptr, int device) = 0;
  // Page-locked host memory, made by the calling thread's current device (see cuda_runtime.cpp for
  // how that device is chosen).
  virtual void* host_alloc_pinned(size_t bytes) = 0;
  virtual void host_free_pinned(void* ptr) = 0;
  // Copies between any two devices (either side may be the CPU), in order with the kernels on the
  // default stream. What the host may assume when it returns (CUDA's "API synchronization behavior"):
  // device-to-host: the data is in host memory; host-to-device: the host buffer may be reused (from
  // pageable memory the copy may still be on its way to the device, behind later kernels on the
  // stream anyway); device-to-device: nothing -- it is only queued, cudaMemcpy does not wait for it.
  virtual void memcpy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) = 0;
  virtual void memset_zero(void* ptr, size_t bytes, int device) = 0;

  // The calling thread's current device. Setting it creates the device's context if there is none.
  virtual void set_device(int device) = 0;
  virtual int current_device() = 0;
  // The device the calling thread has selected (it has a current context), or -1 when it has none:
  // a thread that never selected one, on which current_device() answers 0 without a context on it.
  virtual int thread_selected_device() = 0;
  virtual void synchronize(int device) = 0;
  // The device's free and total memory in bytes (cudaMemGetInfo answers for the current device, so this
  // makes `device` current; cuda_free_memory in core/cuda_runtime.cpp puts back a device the thread had
  // selected, and no other: switching "back" to cuda:0 on a thread that never selected a device would
  // create a context there).
  virtual void memory_info(int device, size_t* free_bytes, size_t* total_bytes) = 0;

  // Streams and events on `device` (the nccl backend's communication stream and its completion events).
  virtual CudaStream create_stream(int device) = 0;
  virtual void destroy_stream(CudaStream stream) = 0;
  virtual CudaEvent create_event(int device) = 0;
  virtual void destroy_event(CudaEvent event) = 0;
  virtual void record_event(CudaEvent event, CudaStream stream) = 0;
  virtual void stream_wait_event(CudaStream stream, CudaEvent event) = 0;
  // done, pending, or failed with `error` set to CUDA's description.
  virtual CudaEventState query_event(CudaEvent event, std::string* error) = 0;

  // core/random.h's fill_uniform on device memory: the same Philox numbers as the CPU loop.
  virtual void fill_uniform(float* out, int64_t n, uint64_t seed, uint64_t offset, float lo, float hi, int device) = 0;
};

// Devices that stand in for real ones where there is no GPU: the fake devices of the tests
// (test/support/fake_cuda.h). What core/cuda_runtime.cpp asks of the driver it asks of them instead.
// None is built into the libraries; a program linked with the test-support library registers its
// own (set_cuda_stand_in_finder in core/cuda_runtime.h).
class CudaStandIn : public CudaApi {
 public:
  virtual int device_count() const = 0;
  virtual bool has_context(int device) const = 0;
  virtual std::vector<int> devices_with_context() const = 0;
};

// The version of the interfaces between tinyddp and its CUDA half (this one, the kernel table, NcclApi):
// every entry point takes it and returns nullptr for another (core/cuda_plugin.h). Bump it with any
// change to them.
constexpr int kCudaPluginAbi = 4;
// libtinyddp_cuda.so's entry point for its CudaApi.
constexpr const char* kCudaApiEntryName = "tinyddp_cuda_api";

}  // namespace tinyddp
