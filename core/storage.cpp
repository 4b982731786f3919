#include "tinyddp/core/storage.h"

namespace tinyddp {

Storage::Storage(size_t bytes, Device device) : block_(allocate(bytes, device)), bytes_(bytes), device_(device) {}

Storage::~Storage() { deallocate(block_, device_); }

}  // namespace tinyddp
