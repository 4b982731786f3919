// SymmetricMemory: a process group's symmetric allocations (symmetric_buffer.h), and which buffer a
// tensor handed to a collective lies in.
//
// ProcessGroup::allocate_symmetric asks it for a tensor; the collectives ask find() whether their
// tensor lies in one, and take the symmetric path when it does (algorithms/symmetric_all_reduce.h).
// Tensors keep their buffers alive; this keeps only weak references, so a buffer goes when its last
// tensor does, and at the group's end release_peers() unmaps the peers' parts of those still alive.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "tinyddp/comm/symmetric/symmetric_buffer.h"
#include "tinyddp/core/tensor.h"

namespace tinyddp::comm {

class SymmetricMemory {
 public:
  // `local_ranks`: the ranks of this host in rank order, `rank` among them; keys go under `prefix`.
  SymmetricMemory(std::shared_ptr<Store> store, std::string prefix, int rank, std::vector<int> local_ranks,
                  std::chrono::milliseconds timeout);

  // A CPU tensor of `shape` in a new symmetric buffer. Every rank of the host calls it, in the same
  // order, with the same shape and dtype; it returns once every peer's part is mapped here.
  Tensor allocate(const Shape& shape, DType dtype);

  // The buffer `bytes` bytes at `data` lie in entirely, and where in it they start.
  struct Found {
    std::shared_ptr<SymmetricBuffer> buffer;
    size_t offset = 0;
  };
  std::optional<Found> find(const void* data, size_t bytes) const;
  // True when no buffer was ever allocated here (find() would find nothing): a test with no lock.
  bool empty() const { return count_.load(std::memory_order_acquire) == 0; }

  // Unmaps the peers' parts of every buffer still alive (the group ended or aborted).
  void release_peers();

 private:
  std::shared_ptr<Store> store_;
  std::string prefix_;
  int rank_;
  std::vector<int> local_ranks_;
  std::chrono::milliseconds timeout_;
  mutable std::mutex mutex_;
  std::vector<std::weak_ptr<SymmetricBuffer>> buffers_;
  int next_index_ = 0;
  std::atomic<int> count_{0};
};

}  // namespace tinyddp::comm
