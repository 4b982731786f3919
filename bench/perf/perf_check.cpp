#include "bench/perf/perf_check.h"

namespace tinyddp::bench {

int64_t check_placement(comm::ProcessGroup& group, const PerfCollective& collective, const Placement& placement,
                        const CollectiveCounts& counts, const TestValues& values, comm::ReduceOp op, int root) {
  const int rank = group.rank();
  // The output first: in place, the input lies inside it (or it inside the input) and must win.
  write_elements(placement.output, [](size_t) { return TestValues::kUnwritten; });
  if (collective.has_input(rank, root))
    write_elements(placement.input, [&](size_t j) { return collective.input_value(values, rank, root, j); });
  collective.launch(group, placement, op, root)->wait();

  const Tensor out = placement.output.device().is_cpu() ? placement.output : placement.output.to(Device::cpu());
  const DType dtype = out.dtype();
  int64_t wrong = 0;
  dispatch_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    const T* p = out.data<T>();
    for (int64_t i = 0; i < out.numel(); ++i)
      wrong += !(p[i] == T(collective.expected_value(values, dtype, rank, root, counts, size_t(i))));
  });
  return wrong;
}

}  // namespace tinyddp::bench
