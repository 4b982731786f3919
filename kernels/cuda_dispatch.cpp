#include "kernels/cuda_dispatch.h"

#include "core/cuda_plugin.h"
#include "core/cuda_runtime.h"

namespace tinyddp::kernels {

namespace {
const cuda::Kernels& loaded_kernels() {
  static const cuda::Kernels* const table = [] {
    auto entry = reinterpret_cast<cuda::KernelsEntry>(cuda_half_entry(kCudaHalfLibrary, cuda::kKernelsEntryName));
    const cuda::Kernels* kernels = entry(kCudaPluginAbi);
    TINYDDP_CHECK(kernels != nullptr, kCudaHalfLibrary, " was built for another version of tinyddp; hint: rebuild, or set "
                  "TINYDDP_PLUGIN_DIR to the matching build");
    return kernels;
  }();
  return *table;
}
}  // namespace

const cuda::Kernels* cuda_kernels_for(const Tensor& t) {
  if (t.device().is_cpu() || cuda_devices_are_fake()) return nullptr;
  return &loaded_kernels();
}

}  // namespace tinyddp::kernels
