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
  }
  TINYDDP_FAIL("unknown dtype code ", int(t));
}

DType dtype_from_safetensors_name(const std::string& name) {
  for (DType t : {DType::f32, DType::f64, DType::i32, DType::i64, DType::u8})
    if (name == dtype_safetensors_name(t)) return t;
  TINYDDP_FAIL("unsupported safetensors dtype \"", name, "\"; hint: tinyddp reads F32, F64, I32, I64 and U8");
}

DType dtype_from_name(const std::string& name) {
  for (DType t : {DType::f32, DType::f64, DType::i32, DType::i64, DType::u8})
    if (name == dtype_name(t)) return t;
  TINYDDP_FAIL("unknown dtype \"", name, "\"; hint: use one of f32, f64, i32, i64, u8");
}

}  // namespace tinyddp
