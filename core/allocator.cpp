#include "tinyddp/core/allocator.h"

#include <atomic>
#include <cstdlib>
#include <pthread.h>
#include <sys/mman.h>

#include "tinyddp/core/cuda_runtime.h"
#include "tinyddp/core/env.h"
#include "tinyddp/core/error.h"
#include "tinyddp/core/log.h"

// Under AddressSanitizer every block goes back to the C library, so that a use after free is still
// caught: a cached block would stay valid memory for ASan.
#if defined(__SANITIZE_ADDRESS__)
#define TINYDDP_CPU_CACHE_ENABLED 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TINYDDP_CPU_CACHE_ENABLED 0
#endif
#endif
#ifndef TINYDDP_CPU_CACHE_ENABLED
#define TINYDDP_CPU_CACHE_ENABLED 1
#endif

namespace tinyddp {

namespace {
constexpr size_t kCpuAlignment = 64;
// Ordinary CPU blocks this large take whole huge pages (allocator.h says why).
constexpr size_t kHugePageBytes = size_t(2) << 20;
std::atomic<bool> g_pinned{false};

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// Whether an ordinary CPU block of `bytes` takes whole huge pages: its size, its alignment and the
// kernel's advice all follow from this one answer.
bool on_huge_pages(size_t bytes) {
  static const bool enabled = env::flag("TINYDDP_HUGE_PAGES").value_or(true);
  return bytes >= kHugePageBytes && enabled;
}

// One free list per device, keyed by block size. Sizes are rounded (512 B granularity below 1 MiB,
// 2 MiB above) so a slightly different request can reuse a cached block.
class CudaCache {
 public:
  // Never destroyed: a tensor in a static object may be freed after a static cache would be gone (and
  // at exit the CUDA runtime may be shut down already: a block freed into this cache needs no CUDA call).
  static CudaCache& instance() {
    static CudaCache* cache = new CudaCache;
    return *cache;
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
    void* ptr = cuda_malloc(bytes, device);
    if (ptr == nullptr) {
      // Out of memory is often only the cache holding blocks of other sizes: give them all back, retry once.
      release_locked();
      ptr = cuda_malloc(bytes, device);
    }
    TINYDDP_CHECK(ptr != nullptr, "out of memory on cuda:", device, " allocating ", bytes, " bytes (tensors hold ",
                  dev.stats.bytes_in_use, " bytes of it; the cached blocks were returned and that was not enough)",
                  hint("use a smaller batch or model, or drop tensors you no longer need"));
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
// Freed CPU blocks, by size (rounded to the alignment), kept for the next request of the same size.
// Exact sizes only: a training step asks for the same few sizes again and again, and an exact match
// never wastes memory. Pinned and ordinary blocks live in separate lists, each with its own limit (a
// pinned request must get pinned memory, and ordinary blocks must not crowd the pinned ones out).
// Pinned blocks of every size are kept, not only large ones: cudaFreeHost waits for the whole device
// to go idle, so freeing a staging buffer per collective would stall the GPU each time; their sizes are
// rounded up (to a power of two below 1 MiB, to 2 MiB above) so that staging buffers of nearby sizes
// share blocks without a large one costing up to twice its size.
class CpuCache {
 public:
  // Smaller blocks are cheap for malloc (thread caches, no page faults); caching them would only add
  // the lock.
  static constexpr size_t kMinBytes = TINYDDP_CPU_CACHE_ENABLED ? size_t(64) << 10 : ~size_t(0);
  static constexpr size_t kLimitBytes = size_t(256) << 20;
  static constexpr size_t kMinPinnedBytes = 4096;  // a page
  static constexpr size_t kPinnedPowerOfTwoBytes = size_t(1) << 20;
  static constexpr size_t kPinnedGranularity = size_t(2) << 20;

  // Never destroyed: tensors in static objects may be freed after a static cache would be gone.
  static CpuCache& instance() {
    static CpuCache* cache = new CpuCache;
    return *cache;
  }

  // The size a block of `bytes` is allocated and cached at.
  static size_t block_size(size_t bytes, bool pinned) {
    if (!pinned) return round_up(bytes, on_huge_pages(bytes) ? kHugePageBytes : kCpuAlignment);
    if (bytes > kPinnedPowerOfTwoBytes) return round_up(bytes, kPinnedGranularity);
    size_t size = kMinPinnedBytes;
    while (size < bytes) size *= 2;
    return size;
  }
  static bool cacheable(size_t block_bytes, bool pinned) { return pinned || block_bytes >= kMinBytes; }

  // A cached block of exactly `bytes`, or nullptr (the caller allocates and counts it).
  void* take(size_t bytes, bool pinned) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& free = pinned ? pinned_free_ : free_;
    auto it = free.find(bytes);
    if (it == free.end()) {
      ++stats_.system_allocations;
      return nullptr;
    }
    void* ptr = it->second;
    free.erase(it);
    (pinned ? pinned_bytes_ : ordinary_bytes_) -= bytes;
    stats_.bytes_cached -= bytes;
    ++stats_.reuses;
    return ptr;
  }

  // Keeps the block if there is room; false: the caller frees it.
  bool give(void* ptr, size_t bytes, bool pinned) {
    std::lock_guard<std::mutex> lock(mutex_);
    size_t& kept = pinned ? pinned_bytes_ : ordinary_bytes_;
    if (kept + bytes > kLimitBytes) return false;
    (pinned ? pinned_free_ : free_).emplace(bytes, ptr);
    kept += bytes;
    stats_.bytes_cached += bytes;
    return true;
  }

  CpuCacheStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

  void release() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [bytes, ptr] : free_) std::free(ptr);
    for (auto& [bytes, ptr] : pinned_free_) cuda_host_free_pinned(ptr);
    free_.clear();
    pinned_free_.clear();
    stats_.bytes_cached = ordinary_bytes_ = pinned_bytes_ = 0;
  }

  // fork() copies only the calling thread: a lock held by another thread (a communication thread
  // freeing a buffer) would stay locked forever in the child. Hold it across the fork, as glibc's
  // malloc does with its own locks, so both sides start with it free.
  void lock_for_fork() { mutex_.lock(); }
  void unlock_after_fork() { mutex_.unlock(); }

 private:
  CpuCache() {
    pthread_atfork([] { instance().lock_for_fork(); }, [] { instance().unlock_after_fork(); },
                   [] { instance().unlock_after_fork(); });
  }

  std::mutex mutex_;
  std::multimap<size_t, void*> free_, pinned_free_;
  size_t ordinary_bytes_ = 0, pinned_bytes_ = 0;  // of stats_.bytes_cached
  CpuCacheStats stats_;
};

}  // namespace

void enable_pinned_cpu_memory() { g_pinned = true; }
void disable_pinned_cpu_memory() { g_pinned = false; }
bool pinned_cpu_memory_enabled() { return g_pinned; }

Allocation allocate(size_t bytes, Device device, bool pinned) {
  Allocation block;
  if (device.is_cpu()) {
    block.bytes = bytes;
    if (bytes == 0) return block;
    block.pinned = pinned && g_pinned;  // read once: another thread may enable pinning meanwhile
    const size_t size = CpuCache::block_size(bytes, block.pinned);
    if (CpuCache::cacheable(size, block.pinned)) {
      block.ptr = CpuCache::instance().take(size, block.pinned);
      if (block.ptr != nullptr) return block;
    }
    if (block.pinned) {
      block.ptr = cuda_host_alloc_pinned(size);  // the block's full size: it may be cached and reused
    } else {
      const bool huge = on_huge_pages(bytes);
      block.ptr = std::aligned_alloc(huge ? kHugePageBytes : kCpuAlignment, size);
      TINYDDP_CHECK(block.ptr != nullptr, "out of CPU memory allocating ", bytes, " bytes",
                    hint("use a smaller batch or model"));
      // Advice only: a kernel without transparent huge pages, or with them off, keeps ordinary pages.
      if (huge) ::madvise(block.ptr, size, MADV_HUGEPAGE);
    }
    return block;
  }
  require_device(device);
  enable_pinned_cpu_memory();
  block.bytes = CudaCache::rounded(bytes == 0 ? 1 : bytes);
  block.ptr = CudaCache::instance().take(block.bytes, device.index);
  return block;
}

void deallocate(const Allocation& block, Device device) noexcept {
  if (block.ptr == nullptr) return;
  try {
    if (device.is_cpu()) {
      const size_t size = CpuCache::block_size(block.bytes, block.pinned);
      if (CpuCache::cacheable(size, block.pinned) && CpuCache::instance().give(block.ptr, size, block.pinned)) return;
      if (block.pinned)
        cuda_host_free_pinned(block.ptr);
      else
        std::free(block.ptr);
      return;
    }
    CudaCache::instance().give(block.ptr, block.bytes, device.index);
  } catch (const std::exception& e) {
    // Called from destructors, often while another error unwinds the stack: throwing here would
    // terminate the program and hide that first error. After a sticky CUDA error every free fails
    // the same way, so it is said once; the block is lost (the context is unusable anyway).
    static std::atomic<bool> said{false};
    if (!said.exchange(true))
      log_line(LogLevel::error, "allocator",
               std::string("freeing memory failed; this and later failed frees are given up: ") + e.what());
  }
}

CpuCacheStats cpu_cache_stats() { return CpuCache::instance().stats(); }
void cpu_cache_release() { CpuCache::instance().release(); }

CudaCacheStats cuda_cache_stats(int device) { return CudaCache::instance().stats(device); }
void cuda_cache_release() { CudaCache::instance().release(); }

}  // namespace tinyddp
