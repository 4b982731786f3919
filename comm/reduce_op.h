// ReduceOp: how all_reduce and reduce_scatter combine the ranks' values, and the element loops
// that do it.
//
// The loops are the arithmetic inner step of every algorithm: the ring adds each incoming
// segment into the local buffer while the next segment is still on the wire, so they must run at
// memory speed. They are plain loops the compiler vectorises.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "tinyddp/core/dtype.h"

namespace tinyddp::comm {

enum class ReduceOp : uint8_t { sum, avg, max, min, prod };

const char* reduce_op_name(ReduceOp op);  // "sum", "avg", ...
// Inverse of reduce_op_name; throws listing the valid names.
ReduceOp reduce_op_from_name(const std::string& name);

// The dtypes the collectives accept (u8 is a storage type only, not reducible).
bool is_collective_dtype(DType dtype);

// dst[i] = a[i] (op) b[i] for `count` elements. `dst` may be `a` (the usual in-place case). avg
// combines like sum: the division by the world size happens once, at the end (finish_average).
// Integer sums and products wrap around (two's complement) instead of being undefined on overflow.
// bf16 and f16 are widened to f32, combined, and rounded once back to nearest even: a sum of two
// 16-bit values is rounded once per call (so once per step of an algorithm).
void reduce_elements(void* dst, const void* a, const void* b, size_t count, DType dtype, ReduceOp op);

// Turns a sum into an average in place: floats divide (bf16 and f16 in f32, rounded once), integers
// divide truncating toward zero.
void finish_average(void* data, size_t count, DType dtype, int world_size);

// a[i] = b[i] = a[i] (op) b[i], and for avg that divided by world_size as finish_average divides: the
// same values as reduce_elements(a, a, b), finish_average(a) and a copy of a into b, bitwise. `b` is
// a peer's memory: one pass that reads and writes each of its lines takes them from the peer's cache
// once, where the copy after the reduction would take them a second time (a symmetric all-reduce's
// last peer, algorithms/symmetric_all_reduce.h).
void reduce_elements_into_both(void* a, void* b, size_t count, DType dtype, ReduceOp op, int world_size);

}  // namespace tinyddp::comm
