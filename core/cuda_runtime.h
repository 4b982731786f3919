// The small slice of the CUDA runtime that core needs, behind functions that also exist in a
// CPU-only build. Callers never include cuda_runtime_api.h themselves, so everything above core
// compiles the same way with and without CUDA.
//
// "No CUDA" has three causes and all of them mean zero devices, never a crash: the build left CUDA
// out, the machine has no driver (or no GPU), or the driver is older than the toolkit needs.
#pragma once

#include <cstddef>
#include <string>

#include "core/device.h"

namespace tinyddp {

// True when this build compiled the CUDA sources (TINYDDP_CUDA found nvcc).
bool cuda_built();
// Number of usable CUDA devices: 0 when !cuda_built(), without a driver, or with a too-old driver.
int cuda_device_count();
// Why cuda_device_count() is 0, in words a user can act on ("" when devices exist).
std::string cuda_unavailable_reason();
// Throws a clear error unless `device` is the CPU or an existing CUDA device.
void require_device(Device device);

// Raw memory. These are used by the allocators in core/allocator.h; everything else asks those.
void* cuda_malloc(size_t bytes, int device);
void cuda_free(void* ptr, int device);
void* cuda_host_alloc_pinned(size_t bytes);
void cuda_host_free_pinned(void* ptr);
// Copies `bytes` between any two devices (either side may be the CPU) and waits for the copy.
void cuda_memcpy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);
void cuda_memset_zero(void* ptr, size_t bytes, int device);
void cuda_set_device(int device);
void cuda_synchronize(int device);

}  // namespace tinyddp
