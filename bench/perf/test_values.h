// TestValues: the inputs of the collective benchmarks, chosen so that every result is known exactly.
//
// Rank r's element j is a small integer drawn from a hash of (r, j, seed): every type represents it
// exactly, every sum, max, min and product of a few of them too (products of 2, -1 and 1 stay below
// 2^world; for bf16 and f16 the integers shrink with the world size so that every partial sum stays
// within 256, where bf16 still holds every integer), so the result of any correct implementation, in any order of
// reduction, is one exact value and #wrong counts real errors. A hash, not a short period like j % 5, so that a chunk
// written to the wrong place cannot land on equal values. The seed changes for every check, so a
// buffer left over from an earlier run never passes for a new result.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "tinyddp/comm/reduce_op.h"
#include "tinyddp/core/dtype.h"

namespace tinyddp::bench {

class TestValues {
 public:
  TestValues(comm::ReduceOp op, int world, uint32_t seed, DType dtype = DType::f32)
      : op_(op), world_(world), seed_(seed), half_(dtype == DType::bf16 || dtype == DType::f16) {}

  // Rank r's input element j.
  double input(int rank, size_t j) const {
    uint32_t h = mix(uint32_t(j) ^ uint32_t(j >> 32) * 0x27d4eb2fu, uint32_t(rank), seed_);
    if (op_ == comm::ReduceOp::prod) {
      static constexpr double kFactors[3] = {2.0, -1.0, 1.0};
      return kFactors[h % 3];
    }
    const int half_range = half_ ? std::max(1, std::min(50, 256 / world_)) : 50;
    return double(int(h % uint32_t(2 * half_range + 1)) - half_range);  // -50 .. 50, or less for 16-bit floats
  }

  // Every rank's element j reduced with the op, computed in type T as the collective computes it.
  template <typename T>
  T reduced(size_t j) const {
    T acc = T(input(0, j));
    for (int r = 1; r < world_; ++r) {
      T x = T(input(r, j));
      switch (op_) {
        case comm::ReduceOp::sum:
        case comm::ReduceOp::avg: acc = T(acc + x); break;
        case comm::ReduceOp::prod: acc = T(acc * x); break;
        case comm::ReduceOp::max: acc = x > acc ? x : acc; break;
        case comm::ReduceOp::min: acc = x < acc ? x : acc; break;
      }
    }
    // Integers truncate toward zero, as the library's average does; floats round once.
    if (op_ == comm::ReduceOp::avg) acc = T(acc / T(world_));
    return acc;
  }

  // The same, for a runtime dtype, as a double (exact: every result is a small integer or a half).
  double reduced(DType dtype, size_t j) const {
    return dispatch_dtype(dtype, [&](auto zero) { return double(reduced<decltype(zero)>(j)); });
  }

  // A value no input and no result can take: what output buffers hold before a checked run, so an
  // element the collective never wrote counts as wrong.
  static constexpr double kUnwritten = -1e9;

 private:
  static uint32_t mix(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t h = a * 0x9e3779b1u ^ (b + 1) * 0x85ebca77u ^ (c + 1) * 0xc2b2ae3du;
    h ^= h >> 15;
    h *= 0x2c1b3c6du;
    h ^= h >> 12;
    h *= 0x297a2d39u;
    h ^= h >> 15;
    return h;
  }

  comm::ReduceOp op_;
  int world_;
  uint32_t seed_;
  bool half_;  // bf16 or f16
};

}  // namespace tinyddp::bench
