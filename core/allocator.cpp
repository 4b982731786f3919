#include "core/allocator.h"

#include <atomic>
#include <cstdlib>

#include "core/cuda_runtime.h"
#include "core/error.h"

namespace tinyddp {

namespace {
constexpr size_t kCpuAlignment = 64;
std::atomic<bool> g_pinned{false};

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// One free list per device, keyed by block size. Sizes are rounded (512 B granularity below 1 MiB,
// 2 MiB above) so a slightly different request can reuse a cached block.
class CudaCache {
 public:
  static CudaCache& instance() {
    static CudaCache cache;
    return cache;
  }

  static size_t rounded(size_t bytes) { return bytes < (1u << 20) ? round_up(bytes, 512) : round_up(bytes, 2u << 20); }

  void* take(size_t bytes, int device) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& dev = devices_[device];
    auto it = dev.free.find(bytes);
    if (it != dev.free.end()) {
      void* ptr = it->second;
      dev.free.erase(it);
      dev.stats.bytes_cached -= bytes;
      dev.stats.bytes_in_use += bytes;
      return ptr;
    }
    void* ptr = nullptr;
    try {
      ptr = cuda_malloc(bytes, device);
    } catch (const Error&) {
      // Out of memory is often only fragmentation of the cache: give everything back and retry once.
      release_locked();
      ptr = cuda_malloc(bytes, device);
    }
    dev.stats.bytes_in_use += bytes;
    dev.stats.device_allocations++;
    return ptr;
  }

  void give(void* ptr, size_t bytes, int device) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& dev = devices_[device];
    dev.free.emplace(bytes, ptr);
    dev.stats.bytes_in_use -= bytes;
    dev.stats.bytes_cached += bytes;
  }

  CudaCacheStats stats(int device) {
    std::lock_guard<std::mutex> lock(mutex_);
    return devices_[device].stats;
  }

  void release() {
    std::lock_guard<std::mutex> lock(mutex_);
    release_locked();
  }

 private:
  struct PerDevice {
    std::multimap<size_t, void*> free;
    CudaCacheStats stats;
  };

  void release_locked() {
    for (auto& [device, dev] : devices_) {
      for (auto& [bytes, ptr] : dev.free) cuda_free(ptr, device);
      dev.free.clear();
      dev.stats.bytes_cached = 0;
    }
  }

  std::mutex mutex_;
  std::map<int, PerDevice> devices_;
};
}  // namespace

void enable_pinned_cpu_memory() { g_pinned = true; }
bool pinned_cpu_memory_enabled() { return g_pinned; }

Allocation allocate(size_t bytes, Device device) {
  Allocation block;
  if (device.is_cpu()) {
    block.bytes = bytes;
    if (bytes == 0) return block;
    if (g_pinned) {
      block.ptr = cuda_host_alloc_pinned(bytes);
      block.pinned = true;
    } else {
      block.ptr = std::aligned_alloc(kCpuAlignment, round_up(bytes, kCpuAlignment));
      TINYDDP_CHECK(block.ptr != nullptr, "out of CPU memory allocating ", bytes, " bytes; hint: use a smaller batch or model");
    }
    return block;
  }
  require_device(device);
  enable_pinned_cpu_memory();
  block.bytes = CudaCache::rounded(bytes == 0 ? 1 : bytes);
  block.ptr = CudaCache::instance().take(block.bytes, device.index);
  return block;
}

void deallocate(const Allocation& block, Device device) {
  if (block.ptr == nullptr) return;
  if (device.is_cpu()) {
    if (block.pinned) cuda_host_free_pinned(block.ptr);
    else std::free(block.ptr);
    return;
  }
  CudaCache::instance().give(block.ptr, block.bytes, device.index);
}

CudaCacheStats cuda_cache_stats(int device) { return CudaCache::instance().stats(device); }
void cuda_cache_release() { CudaCache::instance().release(); }

}  // namespace tinyddp
