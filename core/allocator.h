// Allocators: where Storage gets its bytes.
//
// CPU memory is 64-byte aligned (a cache line, and what AVX-512 loads like). Once a CUDA device is in
// use, new CPU blocks are page-locked ("pinned") so host<->device copies run at full PCIe speed and can
// be asynchronous: that is what staging buffers for the ring backend need.
//
// CUDA memory comes from a caching allocator: cudaMalloc/cudaFree synchronise the whole device and
// cost tens of microseconds, so freed blocks are kept in per-device free lists, by rounded size, and
// handed out again. (PyTorch's CUDACachingAllocator does the same with more machinery.)
#pragma once

#include <cstddef>
#include <map>
#include <mutex>
#include <vector>

#include "core/device.h"

namespace tinyddp {

// A block of memory and how to give it back.
struct Allocation {
  void* ptr = nullptr;
  size_t bytes = 0;
  bool pinned = false;  // CPU memory allocated with cudaHostAlloc
};

Allocation allocate(size_t bytes, Device device);
void deallocate(const Allocation& block, Device device);

// Makes later CPU allocations pinned. Called when the first CUDA tensor is created, so a CPU-only
// program never touches the CUDA runtime.
void enable_pinned_cpu_memory();
bool pinned_cpu_memory_enabled();

// Statistics of the CUDA caching allocator for one device (for tests and the trace).
struct CudaCacheStats {
  size_t bytes_in_use = 0;
  size_t bytes_cached = 0;  // freed by tensors, kept for reuse
  size_t device_allocations = 0;  // calls that reached cudaMalloc
};
CudaCacheStats cuda_cache_stats(int device);
// Returns every cached (unused) block of every device to the driver.
void cuda_cache_release();

}  // namespace tinyddp
