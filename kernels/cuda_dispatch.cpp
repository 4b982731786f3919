#include "tinyddp/kernels/cuda_dispatch.h"

#include "tinyddp/core/cuda_plugin.h"
#include "tinyddp/core/cuda_runtime.h"

namespace tinyddp::kernels {

namespace {
const cuda::Kernels& loaded_kernels() {
  static const cuda::Kernels* const table =
      cuda_half_interface<const cuda::Kernels>(kCudaHalfLibrary, cuda::kKernelsEntryName);
  return *table;
}
}  // namespace

const cuda::Kernels* cuda_kernels_for(const Tensor& t) {
  if (t.device().is_cpu() || cuda_devices_are_fake()) return nullptr;
  return &loaded_kernels();
}

}  // namespace tinyddp::kernels
