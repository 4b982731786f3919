#include "tinyddp/core/cuda_driver.h"

#include <dlfcn.h>
#include <unistd.h>

namespace tinyddp {

namespace {

// The driver API's types are plain integers: CUresult an enum, CUdevice an int. Declared here so
// that nothing outside the CUDA half includes cuda.h.
using CuInit = int (*)(unsigned flags);
using CuDriverGetVersion = int (*)(int* version);
using CuDeviceGetCount = int (*)(int* count);
using CuDeviceGet = int (*)(int* device, int ordinal);
using CuDevicePrimaryCtxGetState = int (*)(int device, unsigned* flags, int* active);
using CuGetErrorString = int (*)(int result, const char** text);

constexpr int kCudaErrorNoDevice = 100;  // CUDA_ERROR_NO_DEVICE

struct Driver {
  CudaDriverFacts facts;
  CuDeviceGet device_get = nullptr;
  CuDevicePrimaryCtxGetState primary_context_state = nullptr;
};

template <typename Fn>
bool find(void* library, const char* name, Fn& fn, std::string& error) {
  fn = reinterpret_cast<Fn>(dlsym(library, name));
  if (fn == nullptr) error = std::string("libcuda.so.1 has no ") + name + " (a driver too old for this program)";
  return fn != nullptr;
}

Driver probe() {
  Driver d;
  CudaDriverFacts& f = d.facts;
  f.kernel_module_loaded = access("/proc/driver/nvidia/version", R_OK) == 0;
  // Never closed: the CUDA runtime opens the same library later, and the driver must outlive every
  // context anyway.
  void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* error = dlerror();
    f.library_error = error ? error : "dlopen failed";
    return d;
  }
  CuInit init = nullptr;
  CuDriverGetVersion get_version = nullptr;
  CuDeviceGetCount get_count = nullptr;
  CuGetErrorString error_string = nullptr;
  bool all = find(library, "cuInit", init, f.library_error) &&
             find(library, "cuDriverGetVersion", get_version, f.library_error) &&
             find(library, "cuDeviceGetCount", get_count, f.library_error) &&
             find(library, "cuDeviceGet", d.device_get, f.library_error) &&
             find(library, "cuDevicePrimaryCtxGetState", d.primary_context_state, f.library_error) &&
             find(library, "cuGetErrorString", error_string, f.library_error);
  if (!all) return d;
  f.library_loaded = true;
  get_version(&f.driver_version);
  f.init_result = init(0);
  if (f.init_result != 0) {
    const char* text = nullptr;
    error_string(f.init_result, &text);
    f.init_error = text ? text : "error " + std::to_string(f.init_result);
    return d;
  }
  if (get_count(&f.device_count) != 0) f.device_count = 0;
  return d;
}

const Driver& driver() {
  static const Driver d = probe();
  return d;
}

// A library hint names the API, not one program's flag (the examples' is --device cpu).
const char* const kCpuHint = "run on the CPU instead (Device::cpu(): it needs no GPU)";

}  // namespace

std::string cuda_version_string(int version) {
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

CudaDriverAssessment assess_cuda_driver(const CudaDriverFacts& f, int toolkit_version) {
  CudaDriverAssessment a;
  if (!f.library_loaded) {
    if (f.kernel_module_loaded)
      a.reason = "the NVIDIA kernel driver is loaded, but its library libcuda.so.1 could not be opened (" +
                 f.library_error +
                 "); hint: install the driver's user-space part (libcuda), in a container run it with "
                 "the NVIDIA container toolkit (--gpus all), or " +
                 kCpuHint;
    else
      a.reason = "no NVIDIA driver found (" + f.library_error + "); hint: install the NVIDIA driver, or " + kCpuHint;
    return a;
  }
  if (f.init_result == kCudaErrorNoDevice) {
    a.reason = "no CUDA device was found (the NVIDIA driver " + cuda_version_string(f.driver_version) +
               " sees none); hint: check nvidia-smi and CUDA_VISIBLE_DEVICES, or " + kCpuHint;
    return a;
  }
  if (f.init_result != 0) {
    a.reason = "the NVIDIA driver could not start (cuInit: " + f.init_error + "); hint: check nvidia-smi, or " +
               kCpuHint;
    return a;
  }
  if (toolkit_version > 0 && f.driver_version / 1000 < toolkit_version / 1000) {
    a.reason = "the NVIDIA driver supports CUDA " + cuda_version_string(f.driver_version) +
               ", but this build needs CUDA " + std::to_string(toolkit_version / 1000) +
               ".0 or newer (it was compiled with CUDA " + cuda_version_string(toolkit_version) +
               "); hint: update the driver, rebuild tinyddp with a CUDA toolkit " + "the driver supports, or " +
               kCpuHint;
    return a;
  }
  if (f.device_count <= 0) {
    a.reason = std::string("no CUDA device was found; hint: check nvidia-smi and CUDA_VISIBLE_DEVICES, or ") + kCpuHint;
    return a;
  }
  a.device_count = f.device_count;
  return a;
}

const CudaDriverFacts& cuda_driver_facts() { return driver().facts; }

bool cuda_primary_context_active(int device) {
  const Driver& d = driver();
  if (!d.facts.library_loaded || d.facts.init_result != 0 || device < 0 || device >= d.facts.device_count) return false;
  int handle = 0;
  unsigned flags = 0;
  int active = 0;
  if (d.device_get(&handle, device) != 0) return false;
  return d.primary_context_state(handle, &flags, &active) == 0 && active != 0;
}

}  // namespace tinyddp
