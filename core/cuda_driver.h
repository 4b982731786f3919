// The NVIDIA driver, asked directly: how many CUDA devices there are, and why there are none.
//
// Counting devices must not cost what using them costs. The CUDA runtime and cuBLAS are large
// libraries (the CUDA half, libtinyddp_cuda.so, loads them on first use); the driver's own library,
// libcuda.so.1, answers "how many devices" by itself. It is opened here with dlopen, so a machine
// without a driver pays one failed dlopen, and a program that never touches a GPU never starts the
// CUDA runtime. cuInit creates no context (no GPU memory is taken), which matters for MultiDevice's
// spawner: it counts the GPUs but never uses one.
//
// The facts are gathered once (cuda_driver_facts) and read by a pure function (assess_cuda_driver)
// that turns them into a device count and, when it is 0, a reason a user can act on: "no NVIDIA
// driver found" is not "the driver is too old" is not "no device is visible".
#pragma once

#include <string>

namespace tinyddp {

struct CudaDriverFacts {
  bool library_loaded = false;        // libcuda.so.1 opened, and its functions found
  std::string library_error;          // dlerror() when it was not
  bool kernel_module_loaded = false;  // /proc/driver/nvidia/version exists
  int init_result = 0;                // cuInit's CUresult (0: success; 100: no device)
  std::string init_error;             // the driver's description of init_result
  int driver_version = 0;             // the newest CUDA the driver supports: 12040 is CUDA 12.4
  int device_count = 0;               // cuDeviceGetCount (CUDA_VISIBLE_DEVICES applies)
};

struct CudaDriverAssessment {
  int device_count = 0;
  std::string reason;  // why device_count is 0, with a hint; "" when devices exist
};

// What the facts mean for a program built with CUDA toolkit `toolkit_version` (13000 is 13.0). A CUDA
// runtime of major version M runs on any driver that supports CUDA M.0 or newer (CUDA's minor version
// compatibility), so only the major versions are compared.
CudaDriverAssessment assess_cuda_driver(const CudaDriverFacts& facts, int toolkit_version);

// This machine's facts, gathered on the first call (thread-safe).
const CudaDriverFacts& cuda_driver_facts();

// Whether `device` has an active primary context in this process: the driver's own bookkeeping, true
// once any thread used the device. False without a driver.
bool cuda_primary_context_active(int device);

// "13.0" for 13000.
std::string cuda_version_string(int version);

}  // namespace tinyddp
