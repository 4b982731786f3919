// Tensor: a shape, a dtype and a window (offset + element count) into a shared Storage.
//
// Tensors are always contiguous (row-major). Copying a Tensor object is cheap and shares the
// memory, like a PyTorch tensor handle; use clone() for a deep copy. A view() is a window into the
// same storage: writing through the view writes the original.
#pragma once

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "tinyddp/core/device.h"
#include "tinyddp/core/dtype.h"
#include "tinyddp/core/error.h"
#include "tinyddp/core/storage.h"

namespace tinyddp {

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& shape);
std::string shape_str(const Shape& shape);  // "[32, 10]"

class Tensor {
 public:
  Tensor() = default;  // an undefined tensor: defined() == false

  // New tensors. empty() leaves the memory uninitialised; zeros() clears it.
  static Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  // A CPU tensor in page-locked memory once a CUDA device is in use (ordinary memory before): for a
  // buffer that is copied to or from a GPU again and again (staging, data-loader batches).
  static Tensor empty_pinned(const Shape& shape, DType dtype = DType::f32);
  // A copy in pinned memory (empty_pinned), or this tensor when it is pinned already or no CUDA device
  // is in use. PyTorch's Tensor.pin_memory().
  Tensor pin_memory() const;
  // A tensor of `shape` over the start of `storage` (which must hold it), sharing it.
  static Tensor over(std::shared_ptr<Storage> storage, const Shape& shape, DType dtype = DType::f32);
  // A CPU tensor holding a copy of `values`; the shape must hold exactly values.size() elements.
  template <typename T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape) {
    Tensor t = empty(shape, dtype_of<T>());
    TINYDDP_CHECK(size_t(t.numel()) == values.size(), "from_vector: shape ", shape_str(shape), " holds ", t.numel(),
                  " elements but ", values.size(), " values were given");
    if (!values.empty()) std::memcpy(t.raw_data(), values.data(), values.size() * sizeof(T));
    return t;
  }
  template <typename T>
  static Tensor from_vector(const std::vector<T>& values) {
    return from_vector(values, Shape{int64_t(values.size())});
  }

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int64_t dim() const { return int64_t(shape_.size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end, as in PyTorch
  int64_t numel() const { return numel_; }
  DType dtype() const { return dtype_; }
  Device device() const;
  size_t element_size() const { return dtype_size(dtype_); }
  size_t nbytes() const { return size_t(numel_) * element_size(); }
  // Position of the first element inside the storage, in elements of this tensor's dtype.
  int64_t offset() const { return offset_; }
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  bool shares_storage_with(const Tensor& other) const { return defined() && storage_ == other.storage_; }

  void* raw_data();
  const void* raw_data() const;
  // Typed pointer; throws if T does not match the dtype (f32 tensor read as double, for instance).
  template <typename T>
  T* data() {
    check_type(dtype_of<T>());
    return static_cast<T*>(raw_data());
  }
  template <typename T>
  const T* data() const {
    check_type(dtype_of<T>());
    return static_cast<const T*>(raw_data());
  }
  // Reads one element of a CPU tensor, by flat index (for tests and small reads).
  template <typename T>
  T item(int64_t flat_index = 0) const {
    TINYDDP_CHECK(device().is_cpu(), "item() reads CPU tensors", hint("call .to(Device::cpu()) first"));
    TINYDDP_CHECK(flat_index >= 0 && flat_index < numel_, "item(", flat_index, ") is outside a tensor of ", numel_,
                  " elements");
    return data<T>()[flat_index];
  }
  // Copies the elements into a std::vector, from any device.
  template <typename T>
  std::vector<T> to_vector() const {
    Tensor host = device().is_cpu() ? *this : to(Device::cpu());
    const T* p = host.data<T>();
    return std::vector<T>(p, p + numel_);
  }

  // A window of `shape` starting `element_offset` elements after this tensor's first element, in the
  // same storage. The window must fit inside this tensor.
  Tensor view(int64_t element_offset, const Shape& shape) const;
  // The same elements with another shape (one dimension may be -1: inferred).
  Tensor reshape(const Shape& shape) const;
  // Rows [begin, end) of the first dimension, as a view.
  Tensor slice_rows(int64_t begin, int64_t end) const;

  Tensor clone() const;            // a deep copy on the same device
  Tensor to(Device device) const;  // a copy on `device` (a shared handle if already there)
  // A copy with elements of `dtype`, on the same device (a shared handle if already of that dtype),
  // converted as PyTorch's .to(dtype) converts them: to a floating type by rounding to nearest, from a
  // floating to an integer type by rounding toward zero, between integer types modulo 2^bits. A value
  // the integer type cannot hold (NaN, an infinity, out of its range) is an error naming the element.
  // To bf16 and f16: round to nearest even, NaN kept (core/half_precision.h); from f64 through f32, as
  // PyTorch converts. (kernels::convert converts into a tensor that already exists, on any device.)
  Tensor to(DType dtype) const;
  // Copies `src` into this tensor's memory; shapes must hold the same number of elements and the
  // dtypes must match. Either side may be on any device.
  void copy_from(const Tensor& src);
  void zero_();

  std::string describe() const;  // "f32[32, 10] on cpu"

 private:
  void check_type(DType requested) const;

  std::shared_ptr<Storage> storage_;
  int64_t offset_ = 0;
  Shape shape_;
  int64_t numel_ = 0;
  DType dtype_ = DType::f32;
};

// True when both tensors have the same shape and dtype and identical bytes (CPU or any device).
bool bitwise_equal(const Tensor& a, const Tensor& b);

}  // namespace tinyddp
