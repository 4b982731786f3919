// #wrong: one more run of a placement, on inputs whose results are known exactly (TestValues), and
// a count of the output elements that differ from them, on every rank. The output is first filled
// with a value no result can take, so an element the collective never wrote counts too.
#pragma once

#include <cstdint>

#include "bench/perf/perf_collective.h"

namespace tinyddp::bench {

// Writes value(i) into every element of `t`, on any device (through a host copy for CUDA).
template <typename Value>
void write_elements(const Tensor& t, Value value) {
  Tensor host = t.device().is_cpu() ? t : Tensor::empty(t.shape(), t.dtype());
  dispatch_dtype(t.dtype(), [&](auto zero) {
    using T = decltype(zero);
    T* p = host.data<T>();
    for (int64_t i = 0; i < host.numel(); ++i) p[i] = T(value(size_t(i)));
  });
  if (!t.device().is_cpu()) {
    Tensor target = t;
    target.copy_from(host);
  }
}

// Runs `placement` once on fresh inputs and returns this rank's count of wrong output elements.
int64_t check_placement(comm::ProcessGroup& group, const PerfCollective& collective, const Placement& placement,
                        const CollectiveCounts& counts, const TestValues& values, comm::ReduceOp op, int root);

}  // namespace tinyddp::bench
