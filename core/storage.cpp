#include "tinyddp/core/storage.h"

namespace tinyddp {

Storage::Storage(size_t bytes, Device device, bool pinned)
    : block_(allocate(bytes, device, pinned)), bytes_(bytes), device_(device) {}

Storage::Storage(void* data, size_t bytes, Device device, std::shared_ptr<void> owner)
    : block_{data, bytes, false}, owner_(std::move(owner)), bytes_(bytes), device_(device) {}

Storage::~Storage() {
  if (!owner_) deallocate(block_, device_);
}

}  // namespace tinyddp
