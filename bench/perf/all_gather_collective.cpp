// all_gather_perf: every rank ends with every rank's part, in rank order. The size of a row is the
// gathered buffer (world x the part each rank sends), as in nccl-tests. busbw factor (n-1)/n: each
// rank must receive the n-1 parts it does not have.
#include "bench/perf/perf_collective.h"

namespace tinyddp::bench {
namespace {

class AllGather : public PerfCollective {
 public:
  std::string name() const override { return "all_gather"; }
  bool reduces() const override { return false; }
  bool has_root() const override { return false; }
  double bus_factor(int world) const override { return double(world - 1) / world; }
  std::string bus_factor_formula() const override { return "(n-1)/n"; }

  CollectiveCounts counts(size_t count, size_t element_size, int world) const override {
    size_t part = part_per_rank(count, element_size, world);
    return {part, part * size_t(world), part, part, 0};
  }

  // In place, each rank's input is its own slot of the gathered buffer.
  Placement place(const Tensor& send, const Tensor& recv, const CollectiveCounts& c, bool in_place,
                  int rank) const override {
    Tensor out = recv.view(0, {int64_t(c.recv)});
    Tensor in = in_place ? recv.view(int64_t(c.send_in_place) * rank, {int64_t(c.send)})
                         : send.view(0, {int64_t(c.send)});
    return {in, out, in_place};
  }

  comm::WorkPtr launch(comm::ProcessGroup& pg, const Placement& p, comm::ReduceOp, int,
                       const comm::CallOptions& call) const override {
    return pg.all_gather(p.output, p.input, call);
  }

  double input_value(const TestValues& v, int rank, int, size_t j) const override { return v.input(rank, j); }
  double expected_value(const TestValues& v, DType, int, int, const CollectiveCounts& c, size_t i) const override {
    return v.input(int(i / c.param), i % c.param);
  }
};

}  // namespace

const PerfCollective& all_gather_collective() {
  static const AllGather collective;
  return collective;
}

}  // namespace tinyddp::bench
