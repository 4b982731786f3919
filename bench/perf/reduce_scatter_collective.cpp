// reduce_scatter_perf: rank r ends with part r of the element-wise reduction of every rank's
// buffer. The size of a row is the whole input (world x the part each rank keeps), as in
// nccl-tests. busbw factor (n-1)/n: each rank must receive a contribution to its part from each of
// the n-1 others.
#include "bench/perf/perf_collective.h"

namespace tinyddp::bench {
namespace {

class ReduceScatter : public PerfCollective {
 public:
  std::string name() const override { return "reduce_scatter"; }
  bool reduces() const override { return true; }
  bool has_root() const override { return false; }
  double bus_factor(int world) const override { return double(world - 1) / world; }
  std::string bus_factor_formula() const override { return "(n-1)/n"; }

  CollectiveCounts counts(size_t count, size_t element_size, int world) const override {
    size_t part = part_per_rank(count, element_size, world);
    return {part * size_t(world), part, part, 0, part};
  }

  // In place, each rank's output is its own part of the input buffer.
  Placement place(const Tensor& send, const Tensor& recv, const CollectiveCounts& c, bool in_place,
                  int rank) const override {
    Tensor in = send.view(0, {int64_t(c.send)});
    Tensor out = in_place ? send.view(int64_t(c.recv_in_place) * rank, {int64_t(c.recv)})
                          : recv.view(0, {int64_t(c.recv)});
    return {in, out, in_place};
  }

  comm::WorkPtr launch(comm::ProcessGroup& pg, const Placement& p, comm::ReduceOp op, int,
                       const comm::CallOptions& call) const override {
    return pg.reduce_scatter(p.output, p.input, op, call);
  }

  double input_value(const TestValues& v, int rank, int, size_t j) const override { return v.input(rank, j); }
  double expected_value(const TestValues& v, DType dtype, int rank, int, const CollectiveCounts& c,
                        size_t i) const override {
    return v.reduced(dtype, size_t(rank) * c.param + i);
  }
};

}  // namespace

const PerfCollective& reduce_scatter_collective() {
  static const ReduceScatter collective;
  return collective;
}

}  // namespace tinyddp::bench
