#include "tinyddp/comm/nccl/nccl_api.h"

#include <dlfcn.h>

#include <atomic>

#include "tinyddp/comm/nccl/nccl_library_search.h"
#include "tinyddp/core/cuda_plugin.h"
#include "tinyddp/core/cuda_runtime.h"
#include "tinyddp/core/error.h"

namespace tinyddp::comm {

namespace {
std::atomic<NcclApi& (*)()> g_stand_in{nullptr};

#ifndef TINYDDP_WITH_NCCL
[[noreturn]] void not_built() {
  TINYDDP_FAIL(
      "the nccl backend is not in this build (NCCL was not found when it was configured)",
      hint("install "
           "NCCL (libnccl-dev, or set NCCL_HOME) and reconfigure with -DTINYDDP_NCCL=ON, or use the host backend, "
           "which stages CUDA tensors through host memory"));
}
#endif

NcclApi& nccl_half() {
#ifdef TINYDDP_WITH_NCCL
  // libnccl.so.2 is found and preloaded first (nccl_library_search.h); what went wrong is said as it was.
  const std::string why = nccl_unavailable_reason();
  TINYDDP_CHECK(why.empty(), "the nccl backend cannot be used here: ", why);
  // Loaded on the first call; when loading throws, the next call tries again (and says why again).
  static NcclApi* const api = cuda_half_interface<NcclApi>(kNcclHalfLibrary, kNcclApiEntryName);
  return *api;
#else
  not_built();
#endif
}
}  // namespace

void set_nccl_stand_in(NcclApi& (*stand_in)()) { g_stand_in.store(stand_in, std::memory_order_release); }

std::string nccl_load_problem(const std::string& module_path, const std::string& nccl_searched) {
  // Kept loaded when it loads: the backend's own load of the same path then finds it.
  if (::dlopen(module_path.c_str(), RTLD_NOW | RTLD_LOCAL) != nullptr) return "";
  const char* why = ::dlerror();
  return "the NCCL half " + module_path + " does not load: " + (why ? why : "dlopen failed") +
         (nccl_searched.empty() ? ""
                                : " (" + std::string(kNcclLibraryName) + " was looked for in " + nccl_searched + ")") +
         "; hint: install NCCL (libnccl2, the CUDA toolkit's, or the pip wheel nvidia-nccl-cu12/-cu13, whose "
         "nvidia/nccl/lib is searched), or set " +
         kNcclLibraryVariable + " to the libnccl.so.2 to use";
}

namespace {
std::string real_nccl_problem() {
#ifdef TINYDDP_WITH_NCCL
  std::string searched;
  const std::string path = find_cuda_half(kNcclHalfLibrary, &searched);
  if (path.empty()) return std::string(kNcclHalfLibrary) + " was not found (searched " + searched + ")";
  const NcclSearchPlaces places = NcclSearchPlaces::from_environment();
  const NcclLibrarySearch nccl = find_nccl_library(places);
  if (!nccl.problem.empty()) return nccl.problem;
  if (!nccl.path.empty()) {
    std::string problem = preload_nccl_library(nccl.path, places.override_path.has_value());
    if (!problem.empty()) return problem;
  }
  return nccl_load_problem(path, nccl.path.empty() ? nccl.searched : "");
#else
  return "the nccl backend is not in this build (NCCL was not found when it was configured)";
#endif
}
}  // namespace

std::string nccl_unavailable_reason() {
  if (cuda_devices_are_fake())
    return g_stand_in.load(std::memory_order_acquire) != nullptr ? ""
                                                                 : "fake CUDA devices are in use, without a fake NCCL";
  static const std::string reason = real_nccl_problem();  // tried once
  return reason;
}

bool nccl_available() { return nccl_unavailable_reason().empty(); }

NcclApi& nccl_api() {
  if (cuda_devices_are_fake()) {
    NcclApi& (*stand_in)() = g_stand_in.load(std::memory_order_acquire);
    TINYDDP_CHECK(stand_in != nullptr,
                  "the nccl backend was asked for on fake CUDA devices, but this program has no "
                  "fake NCCL",
                  hint("link it with the test-support library (tinyddp_fakes), as the tests are"));
    return stand_in();
  }
#ifndef TINYDDP_WITH_NCCL
  not_built();
#endif
  TINYDDP_CHECK(cuda_device_count() > 0, "the nccl backend needs a CUDA device, but ", cuda_unavailable_reason(),
                hint("use the host backend on machines without GPUs"));
  return nccl_half();
}

}  // namespace tinyddp::comm
