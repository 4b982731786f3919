// Storage: one allocation on one device, shared by every Tensor that views it.
//
// A Tensor is (storage, offset, shape, dtype). Several tensors can share one Storage: that is how
// DDP's gradient buckets work, each parameter's .grad being a view at some offset of one flat buffer,
// so all-reducing the bucket updates every gradient in it without a copy.
#pragma once

#include <cstddef>
#include <memory>

#include "tinyddp/core/allocator.h"
#include "tinyddp/core/device.h"

namespace tinyddp {

class Storage {
 public:
  // `pinned`: page-locked CPU memory, for copies to and from a device (allocator.h says when it is).
  Storage(size_t bytes, Device device, bool pinned = false);
  // Memory that something else owns (comm's symmetric memory, mapped by every rank of a host):
  // `owner` is kept alive as long as this storage, and nothing is freed here.
  Storage(void* data, size_t bytes, Device device, std::shared_ptr<void> owner);
  ~Storage();  // never throws (deallocate logs a failed free)
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() { return block_.ptr; }
  const void* data() const { return block_.ptr; }
  size_t nbytes() const { return bytes_; }
  Device device() const { return device_; }
  bool pinned() const { return block_.pinned; }

 private:
  Allocation block_;
  std::shared_ptr<void> owner_;  // set for memory owned elsewhere
  size_t bytes_;
  Device device_;
};

}  // namespace tinyddp
