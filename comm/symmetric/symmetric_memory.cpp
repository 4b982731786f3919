#include "tinyddp/comm/symmetric/symmetric_memory.h"

#include <algorithm>

#include "tinyddp/core/error.h"

namespace tinyddp::comm {

SymmetricMemory::SymmetricMemory(std::shared_ptr<Store> store, std::string prefix, int rank,
                                 std::vector<int> local_ranks, std::chrono::milliseconds timeout)
    : store_(std::move(store)),
      prefix_(std::move(prefix)),
      rank_(rank),
      local_ranks_(std::move(local_ranks)),
      timeout_(timeout) {}

Tensor SymmetricMemory::allocate(const Shape& shape, DType dtype) {
  const int64_t numel = shape_numel(shape);
  TINYDDP_CHECK(numel >= 0, "allocate_symmetric: shape ", shape_str(shape), " has a negative dimension");
  const size_t bytes = size_t(numel) * dtype_size(dtype);
  int index;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    index = next_index_++;
  }
  auto buffer = SymmetricBuffer::allocate(*store_, prefix_, index, rank_, local_ranks_, bytes, timeout_);
  auto storage = std::make_shared<Storage>(buffer->data(), bytes, Device::cpu(), buffer);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // Buffers whose tensors are all gone leave the list here, so it stays as long as the live ones.
    std::erase_if(buffers_, [](const std::weak_ptr<SymmetricBuffer>& b) { return b.expired(); });
    buffers_.push_back(buffer);
    count_.store(int(buffers_.size()), std::memory_order_release);
  }
  return Tensor::over(std::move(storage), shape, dtype);
}

std::optional<SymmetricMemory::Found> SymmetricMemory::find(const void* data, size_t bytes) const {
  const auto* at = static_cast<const std::byte*>(data);
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& weak : buffers_) {
    auto buffer = weak.lock();
    if (!buffer || !buffer->peers_mapped()) continue;
    const std::byte* begin = buffer->data();
    if (at >= begin && at + bytes <= begin + buffer->bytes()) return Found{std::move(buffer), size_t(at - begin)};
  }
  return std::nullopt;
}

void SymmetricMemory::release_peers() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& weak : buffers_)
    if (auto buffer = weak.lock()) buffer->release_peers();
}

}  // namespace tinyddp::comm
