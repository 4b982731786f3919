// broadcast_perf: every rank ends with the root's buffer. busbw factor 1: all the data must leave
// the root through its one link, whatever the number of ranks.
//
// The library's broadcast works in place (one buffer per rank, the root's is the source), so the
// table has in-place columns only and the out-of-place ones stay blank, as nccl-tests prints a
// placement a test does not run.
#include "bench/perf/perf_collective.h"

namespace tinyddp::bench {
namespace {

class Broadcast : public PerfCollective {
 public:
  std::string name() const override { return "broadcast"; }
  bool reduces() const override { return false; }
  bool has_root() const override { return true; }
  bool has_out_of_place() const override { return false; }
  bool needs_send_buffer() const override { return false; }
  double bus_factor(int) const override { return 1.0; }
  std::string bus_factor_formula() const override { return "1"; }

  CollectiveCounts counts(size_t count, size_t, int) const override { return {count, count, count, 0, 0}; }

  Placement place(const Tensor&, const Tensor& recv, const CollectiveCounts& c, bool, int) const override {
    Tensor buffer = recv.view(0, {int64_t(c.recv)});
    return {buffer, buffer, true};
  }

  comm::WorkPtr launch(comm::ProcessGroup& pg, const Placement& p, comm::ReduceOp, int root,
                       const comm::CallOptions& call) const override {
    return pg.broadcast(p.output, root, call);
  }

  bool has_input(int rank, int root) const override { return rank == root; }
  double input_value(const TestValues& v, int, int root, size_t j) const override { return v.input(root, j); }
  double expected_value(const TestValues& v, DType, int, int root, const CollectiveCounts&, size_t i) const override {
    return v.input(root, i);
  }
};

}  // namespace

const PerfCollective& broadcast_collective() {
  static const Broadcast collective;
  return collective;
}

}  // namespace tinyddp::bench
