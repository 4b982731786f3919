// Summing many floats on the CPU, in double, in a way the compiler can vectorise.
//
// A plain `for (...) sum += term(i);` is a chain of dependent additions: without -ffast-math the
// compiler must keep that exact order and cannot use SIMD. Eight independent partial sums (lanes)
// break the chain; each lane is an ordinary loop-carried sum the vectoriser maps onto vector registers.
// The order is still fixed, so the result is deterministic for a given n. Internal to kernels/*.cpp.
#pragma once

#include <cstdint>

namespace tinyddp::kernels::detail {

// Sum over i in [0, n) of term(i), accumulated in double.
template <typename Term>
double sum_in_lanes(int64_t n, Term term) {
  constexpr int64_t kLanes = 8;
  double lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) lanes[l] += double(term(i + l));
  double tail = 0.0;
  for (; i < n; ++i) tail += double(term(i));
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7])) + tail;
}

}  // namespace tinyddp::kernels::detail
