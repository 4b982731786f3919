#include "tinyddp/core/dtype.h"

#include "tinyddp/core/error.h"

namespace tinyddp {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::u8: return 1;
    case DType::bf16: return 2;
    case DType::f16: return 2;
  }
  TINYDDP_FAIL("unknown dtype code ", int(t));
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::u8: return "u8";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
  }
  TINYDDP_FAIL("unknown dtype code ", int(t));
}

const char* dtype_safetensors_name(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::f64: return "F64";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
    case DType::u8: return "U8";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
  }
  TINYDDP_FAIL("unknown dtype code ", int(t));
}

namespace {
constexpr DType kAllDTypes[] = {DType::f32, DType::f64, DType::i32, DType::i64, DType::u8, DType::bf16, DType::f16};
}  // namespace

bool is_floating_dtype(DType t) { return t == DType::f32 || t == DType::f64 || t == DType::bf16 || t == DType::f16; }

DType dtype_from_safetensors_name(const std::string& name) {
  for (DType t : kAllDTypes)
    if (name == dtype_safetensors_name(t)) return t;
  TINYDDP_FAIL("unsupported safetensors dtype \"", name, "\"",
               hint("tinyddp reads F32, F64, BF16, F16, I32, I64 and U8"));
}

DType dtype_from_name(const std::string& name) {
  for (DType t : kAllDTypes)
    if (name == dtype_name(t)) return t;
  TINYDDP_FAIL("unknown dtype \"", name, "\"", hint("use one of f32, f64, bf16, f16, i32, i64, u8"));
}

}  // namespace tinyddp
