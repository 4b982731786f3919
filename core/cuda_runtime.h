// The slice of CUDA that the rest of tinyddp uses, as functions that exist in every build. Callers
// never include a CUDA header: with CUDA built, the work is done by the CUDA half (core/cuda_plugin.h),
// loaded when a CUDA device is first used; with fake devices (test/support/fake_cuda.h), by the fake.
//
// "No CUDA" has several causes and all of them mean zero devices, never a crash: the build left CUDA
// out, the machine has no NVIDIA driver, the driver is older than the build needs, no GPU is visible,
// or the CUDA half is missing beside the program. cuda_unavailable_reason() says which.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "tinyddp/core/cuda_api.h"
#include "tinyddp/core/device.h"

namespace tinyddp {

// True when this build made the CUDA half (TINYDDP_CUDA found nvcc).
bool cuda_built();
// Number of usable CUDA devices (fake ones included). Asking does not load the CUDA runtime.
int cuda_device_count();
// Why cuda_device_count() is 0, in words a user can act on ("" when devices exist).
std::string cuda_unavailable_reason();
// Throws a clear error unless `device` is the CPU or an existing CUDA device.
void require_device(Device device);
// True while fake devices stand in for CUDA (test/support/fake_cuda.h).
bool cuda_devices_are_fake();

// Where the devices standing in for CUDA come from: a function that returns the stand-in in use, or
// nullptr when there is none (then the real devices count). The test-support library registers its
// fake devices' finder when a program linked with it starts; nothing else does, so a user's program
// holds no fake device at all.
using CudaStandInFinder = CudaStandIn* (*)();
void set_cuda_stand_in_finder(CudaStandInFinder finder);

// The implementation in use: the fake devices, or the CUDA half (loaded on this call if need be).
// Throws with cuda_unavailable_reason() when there is neither.
CudaApi& cuda_api();

// The devices with a CUDA context in this process (the driver's own bookkeeping, or the fake's).
std::vector<int> cuda_devices_with_context();

// Raw memory, for the allocators in core/allocator.h; everything else asks those.
// cuda_malloc returns nullptr when the device is out of memory.
void* cuda_malloc(size_t bytes, int device);
void cuda_free(void* ptr, int device);
// Pinned host memory is made by a device's context. A thread that never selected a device would make
// it on cuda:0 (CUDA's default), creating a context there: in a process of a data-parallel job that
// is another rank's GPU. So these first select, on threads whose device has no context, a device that
// already has one (PyTorch's pinned allocator does the same).
void* cuda_host_alloc_pinned(size_t bytes);
void cuda_host_free_pinned(void* ptr);
// Copies `bytes` between any two devices (either side may be the CPU) and waits for the copy.
void cuda_memcpy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);
void cuda_memset_zero(void* ptr, size_t bytes, int device);
void cuda_set_device(int device);
int cuda_current_device();
void cuda_synchronize(int device);
// `device`'s free memory in bytes (cudaMemGetInfo).
size_t cuda_free_memory(int device);

}  // namespace tinyddp
