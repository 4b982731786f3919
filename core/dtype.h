// DType: the element types a Tensor can hold.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "tinyddp/core/half_precision.h"

namespace tinyddp {

// bf16 and f16 are the 16-bit floats of core/half_precision.h (C++ types bfloat16 and float16).
enum class DType : uint8_t { f32, f64, i32, i64, u8, bf16, f16 };

size_t dtype_size(DType t);
// Short name used in messages and on the command line: "f32", "i64", ...
const char* dtype_name(DType t);
// Name used in safetensors headers: "F32", "I64", ...
const char* dtype_safetensors_name(DType t);
// Inverse of dtype_safetensors_name; throws for a name tinyddp does not support.
DType dtype_from_safetensors_name(const std::string& name);
// Inverse of dtype_name ("f32" -> DType::f32); throws with the list of valid names.
DType dtype_from_name(const std::string& name);

// Maps a C++ type to its DType at compile time: dtype_of<float>() == DType::f32.
template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::f64;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::i32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::i64;
}
template <>
constexpr DType dtype_of<uint8_t>() {
  return DType::u8;
}
template <>
constexpr DType dtype_of<bfloat16>() {
  return DType::bf16;
}
template <>
constexpr DType dtype_of<float16>() {
  return DType::f16;
}

// f32, f64, bf16 and f16.
bool is_floating_dtype(DType t);

// Calls fn with a value of the C++ type that `t` names: dispatch_dtype(t, [&](auto zero) { using T = decltype(zero);
// ... }).
template <typename Fn>
decltype(auto) dispatch_dtype(DType t, Fn&& fn) {
  switch (t) {
    case DType::f32: return fn(float{});
    case DType::f64: return fn(double{});
    case DType::i32: return fn(int32_t{});
    case DType::i64: return fn(int64_t{});
    case DType::u8: return fn(uint8_t{});
    case DType::bf16: return fn(bfloat16{});
    case DType::f16: return fn(float16{});
  }
  return fn(float{});  // unreachable: every enumerator is handled above
}

}  // namespace tinyddp
