#include "tinyddp/core/tensor.h"

#include <cmath>
#include <limits>
#include <sstream>
#include <type_traits>

#include "tinyddp/core/cuda_runtime.h"
#include "tinyddp/core/half_convert.h"

namespace tinyddp {

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    TINYDDP_CHECK(d >= 0, "negative dimension in shape ", shape_str(shape));
    n *= d;
  }
  return n;
}

std::string shape_str(const Shape& shape) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << "]";
  return out.str();
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  Tensor t;
  t.shape_ = shape;
  t.numel_ = shape_numel(shape);
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(size_t(t.numel_) * dtype_size(dtype), device);
  return t;
}

Tensor Tensor::empty_pinned(const Shape& shape, DType dtype) {
  Tensor t;
  t.shape_ = shape;
  t.numel_ = shape_numel(shape);
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(size_t(t.numel_) * dtype_size(dtype), Device::cpu(), /*pinned=*/true);
  return t;
}

Tensor Tensor::pin_memory() const {
  TINYDDP_CHECK(device().is_cpu(), "pin_memory: ", describe(), " is not a CPU tensor",
                hint("only CPU memory can be pinned; a CUDA tensor is device memory already"));
  if (!pinned_cpu_memory_enabled() || (storage_ && storage_->pinned())) return *this;
  Tensor t = empty_pinned(shape_, dtype_);
  t.copy_from(*this);
  return t;
}

Tensor Tensor::over(std::shared_ptr<Storage> storage, const Shape& shape, DType dtype) {
  TINYDDP_CHECK(storage != nullptr, "Tensor::over: no storage was given");
  Tensor t;
  t.shape_ = shape;
  t.numel_ = shape_numel(shape);
  t.dtype_ = dtype;
  TINYDDP_CHECK(size_t(t.numel_) * dtype_size(dtype) <= storage->nbytes(), "Tensor::over: ", shape_str(shape), " of ",
                dtype_name(dtype), " needs ", size_t(t.numel_) * dtype_size(dtype), " bytes, the storage holds ",
                storage->nbytes(), hint("allocate a storage large enough for the shape"));
  t.storage_ = std::move(storage);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.zero_();
  return t;
}

int64_t Tensor::size(int64_t d) const {
  int64_t n = dim();
  TINYDDP_CHECK(d >= -n && d < n, "dimension ", d, " is out of range for ", describe());
  return shape_[size_t(d < 0 ? d + n : d)];
}

Device Tensor::device() const { return storage_ ? storage_->device() : Device::cpu(); }

void* Tensor::raw_data() {
  TINYDDP_CHECK(defined(), "use of an undefined tensor", hint("create it with Tensor::empty or Tensor::zeros"));
  return static_cast<char*>(storage_->data()) + offset_ * int64_t(element_size());
}

const void* Tensor::raw_data() const { return const_cast<Tensor*>(this)->raw_data(); }

void Tensor::check_type(DType requested) const {
  TINYDDP_CHECK(requested == dtype_, "tensor ", describe(), " was accessed as ", dtype_name(requested),
                hint("read it with the C++ type of its dtype"));
}

Tensor Tensor::view(int64_t element_offset, const Shape& shape) const {
  TINYDDP_CHECK(defined(), "view() of an undefined tensor");
  int64_t n = shape_numel(shape);
  TINYDDP_CHECK(element_offset >= 0 && element_offset + n <= numel_, "view of ", n, " elements at offset ",
                element_offset, " does not fit in ", describe());
  Tensor t = *this;
  t.offset_ = offset_ + element_offset;
  t.shape_ = shape;
  t.numel_ = n;
  return t;
}

Tensor Tensor::reshape(const Shape& shape) const {
  Shape resolved = shape;
  int64_t known = 1, infer_at = -1;
  for (size_t i = 0; i < resolved.size(); ++i) {
    if (resolved[i] == -1) {
      TINYDDP_CHECK(infer_at < 0, "reshape to ", shape_str(shape), ": only one dimension may be -1");
      infer_at = int64_t(i);
    } else {
      known *= resolved[i];
    }
  }
  if (infer_at >= 0) {
    TINYDDP_CHECK(known > 0 && numel_ % known == 0, "cannot reshape ", describe(), " to ", shape_str(shape));
    resolved[size_t(infer_at)] = numel_ / known;
  }
  TINYDDP_CHECK(shape_numel(resolved) == numel_, "cannot reshape ", describe(), " to ", shape_str(shape),
                ": the element counts differ");
  Tensor t = *this;
  t.shape_ = resolved;
  return t;
}

Tensor Tensor::slice_rows(int64_t begin, int64_t end) const {
  TINYDDP_CHECK(dim() >= 1, "slice_rows of a 0-d tensor");
  TINYDDP_CHECK(0 <= begin && begin <= end && end <= shape_[0], "rows [", begin, ", ", end, ") are outside ",
                describe());
  Shape s = shape_;
  s[0] = end - begin;
  int64_t row = shape_[0] ? numel_ / shape_[0] : 0;
  return view(begin * row, s);
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_, device());
  t.copy_from(*this);
  return t;
}

Tensor Tensor::to(Device target) const {
  if (target == device()) return *this;
  Tensor t = empty(shape_, dtype_, target);
  t.copy_from(*this);
  return t;
}

namespace {

// Element-wise conversion of CPU memory. C++ leaves a floating-point value outside the target
// integer's range undefined (PyTorch's result for one depends on the machine), so it is refused.
template <typename T>
constexpr bool is_floating_v = std::is_floating_point_v<T> || std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>;

template <typename From, typename To>
void convert_elements(const From* in, To* out, int64_t n, const Tensor& source) {
  // The conversions a 16-bit collective makes, through the vector instructions of this CPU.
  if constexpr (std::is_same_v<From, float> && std::is_same_v<To, bfloat16>)
    return convert_f32_to_bf16(in, out, size_t(n));
  if constexpr (std::is_same_v<From, bfloat16> && std::is_same_v<To, float>)
    return convert_bf16_to_f32(in, out, size_t(n));
  if constexpr (std::is_same_v<From, float> && std::is_same_v<To, float16>)
    return convert_f32_to_f16(in, out, size_t(n));
  if constexpr (std::is_same_v<From, float16> && std::is_same_v<To, float>)
    return convert_f16_to_f32(in, out, size_t(n));
  for (int64_t i = 0; i < n; ++i) {
    if constexpr (is_floating_v<From> && std::is_integral_v<To>) {
      const double whole = std::trunc(double(in[i]));
      const bool fits = std::isfinite(whole) && whole >= double(std::numeric_limits<To>::min()) &&
                        whole < double(std::numeric_limits<To>::max()) + 1.0;
      TINYDDP_CHECK(fits, "Tensor::to(", dtype_name(dtype_of<To>()), "): element ", i, " of ", source.describe(),
                    " is ", double(in[i]), ", which ", dtype_name(dtype_of<To>()), " cannot hold",
                    hint("clamp or clean the values before converting, or convert to a floating type"));
    }
    out[i] = static_cast<To>(in[i]);
  }
}

}  // namespace

Tensor Tensor::to(DType target) const {
  TINYDDP_CHECK(defined(), "to(", dtype_name(target), ") of an undefined tensor", hint("create it first"));
  if (target == dtype_) return *this;
  // Converted on the CPU; a device tensor goes there and back.
  const Tensor host = to(Device::cpu());
  Tensor converted = empty(shape_, target);
  dispatch_dtype(dtype_, [&](auto from_zero) {
    using From = decltype(from_zero);
    dispatch_dtype(target, [&](auto to_zero) {
      using To = decltype(to_zero);
      convert_elements(host.data<From>(), converted.data<To>(), numel_, *this);
    });
  });
  return converted.to(device());
}

void Tensor::copy_from(const Tensor& src) {
  TINYDDP_CHECK(src.numel() == numel_ && src.dtype() == dtype_, "copy_from: cannot copy ", src.describe(), " into ",
                describe(), hint("the element count and dtype must match"));
  if (nbytes() == 0 || (shares_storage_with(src) && offset_ == src.offset_)) return;
  if (device().is_cpu() && src.device().is_cpu())
    std::memmove(raw_data(), src.raw_data(), nbytes());
  else
    cuda_memcpy(raw_data(), device(), src.raw_data(), src.device(), nbytes());
}

void Tensor::zero_() {
  if (nbytes() == 0) return;
  if (device().is_cpu())
    std::memset(raw_data(), 0, nbytes());
  else
    cuda_memset_zero(raw_data(), nbytes(), device().index);
}

std::string Tensor::describe() const {
  if (!defined()) return "an undefined tensor";
  return std::string(dtype_name(dtype_)) + shape_str(shape_) + " on " + device().str();
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  Tensor ha = a.to(Device::cpu()), hb = b.to(Device::cpu());
  return a.nbytes() == 0 || std::memcmp(ha.raw_data(), hb.raw_data(), a.nbytes()) == 0;
}

}  // namespace tinyddp
