// Allocators: where Storage gets its bytes.
//
// CPU memory is 64-byte aligned (a cache line, and what AVX-512 loads like). Page-locked ("pinned")
// memory is given only where it is asked for (Tensor::empty_pinned: the host backend's staging
// buffers, the data loader's batches with pin_memory), and only once a CUDA device is in use: host<->
// device copies from it run at full PCIe speed and can be asynchronous. Ordinary CPU tensors stay
// ordinary memory: pinned memory cannot be swapped, is slow to allocate, and cudaFreeHost waits for
// the whole device, so pinning every allocation would make a 600 MB host tensor lock 600 MB of RAM and
// a free on the data loader's thread stall the GPU.
//
// CPU blocks of 2 MiB and more start on a huge page (2 MiB), span whole huge pages, and are advised to the kernel as
// huge-page memory (madvise MADV_HUGEPAGE; TINYDDP_HUGE_PAGES=0 turns it off): one TLB entry and one page fault where
// ordinary pages take 512, and process_vm_readv pins one page where it would pin 512.
//
// CPU blocks of 64 KiB and more are cached too (pinned blocks of every size: see CpuCache): a training step allocates
// the same activation and gradient sizes every iteration, and handing a freed block back to the C library lets it
// shrink the heap (or munmap the block), so the next step pays page faults to touch the same memory again -- several
// percent of an MLP step. Freed blocks are kept in a free list by size and handed out again; at most 256 MiB are kept,
// beyond that blocks go back to the system. (Not under AddressSanitizer, which must see every free to catch a use after
// it.)
//
// CUDA memory comes from a caching allocator: cudaMalloc/cudaFree synchronise the whole device and
// cost tens of microseconds, so freed blocks are kept in per-device free lists, by rounded size, and
// handed out again. (PyTorch's CUDACachingAllocator does the same with more machinery.)
#pragma once

#include <cstddef>
#include <map>
#include <mutex>
#include <vector>

#include "tinyddp/core/device.h"

namespace tinyddp {

// A block of memory and how to give it back.
struct Allocation {
  void* ptr = nullptr;
  size_t bytes = 0;
  bool pinned = false;  // CPU memory allocated with cudaHostAlloc
};

// `pinned`: a CPU block the caller will copy to or from a device (ignored for device memory). It is
// pinned once CUDA is in use, ordinary memory before: a CPU-only program never loads the CUDA runtime.
Allocation allocate(size_t bytes, Device device, bool pinned = false);
// Never throws: the error of a failed cudaFreeHost (a device already in a sticky error state) is
// logged once, and the block is given up.
void deallocate(const Allocation& block, Device device) noexcept;

// Lets later pinned requests be pinned. Called when the first CUDA tensor is created.
void enable_pinned_cpu_memory();
bool pinned_cpu_memory_enabled();
// Turns pinning off again (fake CUDA devices going away in a test; blocks already pinned stay so).
void disable_pinned_cpu_memory();

// Statistics of the CPU block cache (for tests: a training step that reuses its buffers makes no new
// system allocations after the first step).
struct CpuCacheStats {
  size_t bytes_cached = 0;        // freed by tensors, kept for reuse
  size_t system_allocations = 0;  // cacheable requests that the cache could not serve (malloc'd)
  size_t reuses = 0;              // requests served from the cache
};
CpuCacheStats cpu_cache_stats();
// Returns every cached CPU block to the system.
void cpu_cache_release();

// Statistics of the CUDA caching allocator for one device (for tests and the trace).
struct CudaCacheStats {
  size_t bytes_in_use = 0;
  size_t bytes_cached = 0;        // freed by tensors, kept for reuse
  size_t device_allocations = 0;  // calls that reached cudaMalloc
};
CudaCacheStats cuda_cache_stats(int device);
// Returns every cached (unused) block of every device to the driver.
void cuda_cache_release();

}  // namespace tinyddp
