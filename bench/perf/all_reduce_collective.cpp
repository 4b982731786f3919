// all_reduce_perf: every rank ends with the element-wise reduction of every rank's buffer.
// busbw factor 2(n-1)/n: a bandwidth-optimal all-reduce (the ring's reduce-scatter then
// all-gather) sends and receives 2(n-1)/n of the buffer on every rank.
#include "bench/perf/perf_collective.h"

namespace tinyddp::bench {
namespace {

class AllReduce : public PerfCollective {
 public:
  std::string name() const override { return "all_reduce"; }
  bool reduces() const override { return true; }
  bool has_root() const override { return false; }
  double bus_factor(int world) const override { return 2.0 * (world - 1) / world; }
  std::string bus_factor_formula() const override { return "2(n-1)/n"; }

  CollectiveCounts counts(size_t count, size_t, int) const override { return {count, count, count, 0, 0}; }

  Placement place(const Tensor& send, const Tensor& recv, const CollectiveCounts& c, bool in_place,
                  int) const override {
    Tensor out = recv.view(0, {int64_t(c.recv)});
    return {in_place ? out : send.view(0, {int64_t(c.send)}), out, in_place};
  }

  comm::WorkPtr launch(comm::ProcessGroup& pg, const Placement& p, comm::ReduceOp op, int,
                       const comm::CallOptions& call) const override {
    return p.in_place ? pg.all_reduce(p.output, op, call) : pg.all_reduce_into(p.output, p.input, op, call);
  }

  double input_value(const TestValues& v, int rank, int, size_t j) const override { return v.input(rank, j); }
  double expected_value(const TestValues& v, DType dtype, int, int, const CollectiveCounts&, size_t i) const override {
    return v.reduced(dtype, i);
  }
};

}  // namespace

const PerfCollective& all_reduce_collective() {
  static const AllReduce collective;
  return collective;
}

}  // namespace tinyddp::bench
