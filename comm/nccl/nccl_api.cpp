#include "tinyddp/comm/nccl/nccl_api.h"

#include "tinyddp/comm/nccl/fake_nccl.h"
#include "tinyddp/core/cuda_plugin.h"
#include "tinyddp/core/cuda_runtime.h"
#include "tinyddp/core/error.h"

namespace tinyddp::comm {

namespace {
#ifndef TINYDDP_WITH_NCCL
[[noreturn]] void not_built() {
  TINYDDP_FAIL("the nccl backend is not in this build (NCCL was not found when it was configured); hint: install "
               "NCCL (libnccl-dev, or set NCCL_HOME) and reconfigure with -DTINYDDP_NCCL=ON, or use the host backend, "
               "which stages CUDA tensors through host memory");
}
#endif

NcclApi& nccl_half() {
#ifdef TINYDDP_WITH_NCCL
  // Loaded on the first call; when loading throws, the next call tries again (and says why again).
  static NcclApi* const api = cuda_half_interface<NcclApi>(kNcclHalfLibrary, kNcclApiEntryName);
  return *api;
#else
  not_built();
#endif
}
}  // namespace

bool nccl_available() {
  if (cuda_devices_are_fake()) return true;
#ifdef TINYDDP_WITH_NCCL
  return !find_cuda_half(kNcclHalfLibrary).empty();
#else
  return false;
#endif
}

NcclApi& nccl_api() {
  if (cuda_devices_are_fake()) return fake_nccl();
#ifndef TINYDDP_WITH_NCCL
  not_built();
#endif
  TINYDDP_CHECK(cuda_device_count() > 0, "the nccl backend needs a CUDA device, but ", cuda_unavailable_reason(),
                "; hint: use the host backend on machines without GPUs");
  return nccl_half();
}

}  // namespace tinyddp::comm
