#include "tinyddp/kernels/cuda/scratch.h"

#include <cuda_runtime_api.h>

#include <map>
#include <utility>

#include "tinyddp/core/cuda_check.h"

namespace tinyddp::kernels::cuda::detail {

namespace {

struct Buffers {
  std::map<std::pair<int, int>, std::pair<void*, size_t>> by_device_and_slot;
  ~Buffers() {
    // At thread exit; at process exit the runtime may be gone already, so failures are ignored.
    for (auto& [key, buffer] : by_device_and_slot) cudaFree(buffer.first);
  }
};

}  // namespace

void* scratch(int device, Scratch slot, size_t bytes) {
  thread_local Buffers buffers;
  auto& [ptr, size] = buffers.by_device_and_slot[{device, int(slot)}];
  if (size < bytes) {
    CUDA_CHECK(cudaSetDevice(device));
    if (ptr) CUDA_CHECK(cudaFree(ptr));
    ptr = nullptr;
    size = 0;
    size_t grown = bytes < 4096 ? 4096 : bytes + bytes / 2;
    CUDA_CHECK(cudaMalloc(&ptr, grown));
    size = grown;
  }
  return ptr;
}

}  // namespace tinyddp::kernels::cuda::detail
