#include "tinyddp/comm/reduce_op.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "tinyddp/core/error.h"
#include "tinyddp/core/half_convert.h"

namespace tinyddp::comm {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
    case ReduceOp::prod: return "prod";
  }
  return "?";
}

ReduceOp reduce_op_from_name(const std::string& name) {
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min, ReduceOp::prod})
    if (name == reduce_op_name(op)) return op;
  TINYDDP_FAIL("unknown reduce op '", name, "'", hint("use one of sum, avg, max, min, prod"));
}

bool is_collective_dtype(DType dtype) {
  return dtype == DType::f32 || dtype == DType::f64 || dtype == DType::i32 || dtype == DType::i64 ||
         dtype == DType::bf16 || dtype == DType::f16;
}

namespace {

// Signed overflow is undefined in C++; collectives on integers wrap like the hardware does, so the
// arithmetic happens on the unsigned twin of the type.
template <typename T, bool = std::is_integral_v<T>>
struct ArithOf {
  using type = T;
};
template <typename T>
struct ArithOf<T, true> {
  using type = std::make_unsigned_t<T>;
};
template <typename T>
using Arith = typename ArithOf<T>::type;

// always_inline: the loops are compiled inside each target clone of reduce_elements below, so the
// AVX2 clone gets AVX2 loops.
template <typename T, typename Combine>
[[gnu::always_inline]] inline void combine_loop(T* dst, const T* a, const T* __restrict b, size_t count,
                                                Combine combine) {
  for (size_t i = 0; i < count; ++i) dst[i] = combine(a[i], b[i]);
}

// `b` is the incoming side, read in place in a transport's ring, and it may sit at any address:
// after traffic in a smaller dtype (an odd count of i32s, then f64s) the stream's position in the
// ring is no multiple of this type's size, and a T* load there is undefined (UBSan stops on it).
// Such a run is read through memcpy, which is defined at any address and compiles to plain
// unaligned loads; the aligned case keeps the loop above.
template <typename T, typename Combine>
[[gnu::always_inline]] inline void combine_any(T* dst, const T* a, const void* b, size_t count, Combine combine) {
  if (reinterpret_cast<uintptr_t>(b) % alignof(T) == 0)
    return combine_loop(dst, a, static_cast<const T*>(b), count, combine);
  const auto* bytes = static_cast<const std::byte*>(b);
  for (size_t i = 0; i < count; ++i) {
    T y;
    std::memcpy(&y, bytes + i * sizeof(T), sizeof(T));
    dst[i] = combine(a[i], y);
  }
}

template <typename T>
[[gnu::always_inline]] inline void reduce_typed(T* dst, const T* a, const void* b, size_t count, ReduceOp op) {
  using A = Arith<T>;
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: combine_any(dst, a, b, count, [](T x, T y) { return T(A(x) + A(y)); }); return;
    case ReduceOp::prod: combine_any(dst, a, b, count, [](T x, T y) { return T(A(x) * A(y)); }); return;
    case ReduceOp::max: combine_any(dst, a, b, count, [](T x, T y) { return x < y ? y : x; }); return;
    case ReduceOp::min: combine_any(dst, a, b, count, [](T x, T y) { return y < x ? y : x; }); return;
  }
}

// The 16-bit floats: both sides widened to f32 (exactly), combined in f32, rounded once back, a block
// at a time through the conversion loops of this CPU (F16C, AVX-512-BF16: core/half_convert.h). The
// incoming side is copied out first, as it may sit at an odd address. (Inlined into each target clone
// of reduce_elements, as reduce_typed is, so the f32 loop gets that clone's vector width.)
template <typename Half>
[[gnu::always_inline]] inline void reduce_half(Half* dst, const Half* a, const void* b, size_t count, ReduceOp op) {
  constexpr size_t kBlock = 1024;  // 10 KiB of scratch: stays in L1 beside the segment being reduced
  alignas(64) Half incoming[kBlock];
  alignas(64) float wide_a[kBlock], wide_b[kBlock];
  const auto* b_bytes = static_cast<const std::byte*>(b);
  for (size_t done = 0; done < count; done += kBlock) {
    const size_t n = std::min(kBlock, count - done);
    std::memcpy(incoming, b_bytes + done * sizeof(Half), n * sizeof(Half));
    widen_to_f32(a + done, wide_a, n);
    widen_to_f32(incoming, wide_b, n);
    reduce_typed(wide_a, wide_a, wide_b, n, op);
    round_from_f32(wide_a, dst + done, n);
  }
}

// reduce_elements_into_both for the types combined as they are (no widening): each value combined,
// divided for avg as finish_average divides it (T by T), and stored to both sides.
template <typename T>
[[gnu::always_inline]] inline void reduce_typed_into_both(T* __restrict a, T* __restrict b, size_t count, ReduceOp op,
                                                          int world_size) {
  using A = Arith<T>;
  auto both = [&](auto combine) {
    for (size_t i = 0; i < count; ++i) a[i] = b[i] = combine(a[i], b[i]);
  };
  const T world = T(world_size);
  switch (op) {
    case ReduceOp::sum: return both([](T x, T y) { return T(A(x) + A(y)); });
    case ReduceOp::avg: return both([world](T x, T y) { return T(T(A(x) + A(y)) / world); });  // x / 1 is x
    case ReduceOp::prod: return both([](T x, T y) { return T(A(x) * A(y)); });
    case ReduceOp::max: return both([](T x, T y) { return x < y ? y : x; });
    case ReduceOp::min: return both([](T x, T y) { return y < x ? y : x; });
  }
}

}  // namespace

// The library is built for the baseline x86-64 (SSE2); this one hot function also gets an AVX2 and
// an AVX-512 clone, picked at load time for the CPU it runs on: twice the width while the data is
// in cache, which is where the ring's segments are when they are reduced.
// (Not under ThreadSanitizer: the loader runs the ifunc resolver before the TSan runtime is up, and
// the instrumented resolver crashes every program at load.)
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void reduce_elements(void* dst, const void* a, const void* b, size_t count, DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::f32: return reduce_typed(static_cast<float*>(dst), static_cast<const float*>(a), b, count, op);
    case DType::f64: return reduce_typed(static_cast<double*>(dst), static_cast<const double*>(a), b, count, op);
    case DType::i32: return reduce_typed(static_cast<int32_t*>(dst), static_cast<const int32_t*>(a), b, count, op);
    case DType::i64: return reduce_typed(static_cast<int64_t*>(dst), static_cast<const int64_t*>(a), b, count, op);
    case DType::bf16: return reduce_half(static_cast<bfloat16*>(dst), static_cast<const bfloat16*>(a), b, count, op);
    case DType::f16: return reduce_half(static_cast<float16*>(dst), static_cast<const float16*>(a), b, count, op);
    default: break;
  }
  TINYDDP_FAIL("collectives reduce f32, f64, bf16, f16, i32 and i64, not ", dtype_name(dtype),
               hint("convert the tensor to one of those dtypes first"));
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void reduce_elements_into_both(void* a, void* b, size_t count, DType dtype, ReduceOp op, int world_size) {
  switch (dtype) {
    case DType::f32:
      return reduce_typed_into_both(static_cast<float*>(a), static_cast<float*>(b), count, op, world_size);
    case DType::f64:
      return reduce_typed_into_both(static_cast<double*>(a), static_cast<double*>(b), count, op, world_size);
    case DType::i32:
      return reduce_typed_into_both(static_cast<int32_t*>(a), static_cast<int32_t*>(b), count, op, world_size);
    case DType::i64:
      return reduce_typed_into_both(static_cast<int64_t*>(a), static_cast<int64_t*>(b), count, op, world_size);
    default: break;
  }
  // bf16 and f16 widen a block at a time anyway: the reduction, then the copy.
  reduce_elements(a, a, b, count, dtype, op);
  if (op == ReduceOp::avg) finish_average(a, count, dtype, world_size);
  std::memcpy(b, a, count * dtype_size(dtype));
}

void finish_average(void* data, size_t count, DType dtype, int world_size) {
  if (world_size == 1) return;
  dispatch_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    // 16-bit floats divide in f32 (and round once): their own 1/world_size or world_size may not be exact.
    using Wide = std::conditional_t<std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>, float, T>;
    T* p = static_cast<T*>(data);
    const Wide world = Wide(world_size);
    for (size_t i = 0; i < count; ++i) p[i] = T(Wide(p[i]) / world);
  });
}

}  // namespace tinyddp::comm
