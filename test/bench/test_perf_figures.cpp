// The figures behind the collective benchmarks' table, each against a value worked out by hand:
// nccl-tests' buffer counts and bus bandwidth factors, its percentiles and number format, inputs
// whose results are exact in every type, and a #wrong that counts real errors.
#include <doctest/doctest.h>

#include <cmath>

#include "bench/perf/iteration_stats.h"
#include "bench/perf/perf_check.h"
#include "bench/perf/perf_collective.h"
#include "bench/perf/perf_table.h"

using namespace tinyddp;
using namespace tinyddp::bench;

TEST_CASE("bus bandwidth factors are doc/PERFORMANCE.md's") {
  CHECK(all_reduce_collective().bus_factor(4) == doctest::Approx(1.5));  // 2(n-1)/n
  CHECK(all_reduce_collective().bus_factor(1) == 0.0);
  CHECK(reduce_scatter_collective().bus_factor(4) == doctest::Approx(0.75));  // (n-1)/n
  CHECK(all_gather_collective().bus_factor(8) == doctest::Approx(0.875));     // (n-1)/n
  CHECK(broadcast_collective().bus_factor(8) == 1.0);                         // 1
}

TEST_CASE("buffer counts are nccl-tests': a rank's part of a split buffer is rounded down to 16 bytes") {
  // all_reduce: 1 MiB of floats, every buffer whole.
  CollectiveCounts c = all_reduce_collective().counts(262144, 4, 3);
  CHECK(c.send == 262144);
  CHECK(c.recv == 262144);
  CHECK(c.param == 262144);
  // all_gather, 3 ranks, 1 MiB of floats: 262144 / 3 = 87381, down to a multiple of 4 floats.
  c = all_gather_collective().counts(262144, 4, 3);
  CHECK(c.param == 87380);
  CHECK(c.send == 87380);
  CHECK(c.recv == 87380 * 3);
  CHECK(c.send_in_place == 87380);
  // reduce_scatter, the mirror image; doubles: parts are multiples of 2.
  c = reduce_scatter_collective().counts(1001, 8, 4);
  CHECK(c.param == 250);
  CHECK(c.send == 1000);
  CHECK(c.recv == 250);
  CHECK(c.recv_in_place == 250);
  c = broadcast_collective().counts(77, 4, 5);
  CHECK(c.send == 77);
  CHECK(c.recv == 77);
}

TEST_CASE("per-iteration statistics follow nccl-tests' nearest-rank rule") {
  std::vector<double> times;
  for (int i = 100; i >= 1; --i) times.push_back(i);  // 1..100, unsorted
  IterationStats s = iteration_stats(times);
  CHECK(s.min == 1);
  CHECK(s.max == 100);
  CHECK(s.avg == doctest::Approx(50.5));
  CHECK(s.p50 == 51);
  CHECK(s.p95 == 95);
  CHECK(s.p99 == 99);
  CHECK(s.stdev == doctest::Approx(std::sqrt((100.0 * 100.0 - 1.0) / 12.0)));  // population stdev of 1..n
  CHECK(s.cv_pct() == doctest::Approx(s.stdev / 50.5 * 100));
  // Fewer than 100 samples: p99 is the largest.
  IterationStats few = iteration_stats({3, 1, 2, 5, 4});
  CHECK(few.p99 == 5);
  CHECK(few.p95 == 5);
  CHECK(few.p50 == 3);

  SlowestRank slow = slowest_rank({{10, 10}, {12, 14}, {9, 11}});
  CHECK(slow.rank == 1);
  CHECK(slow.mean == 13);
  CHECK(slow.spread_pct == doctest::Approx(30.0));  // 13 against the fastest rank's 10
}

TEST_CASE("numbers fit their columns as nccl-tests fits them") {
  CHECK(fit_number(1.5, 7) == "   1.50");
  CHECK(fit_number(1234.567, 7) == "1234.57");
  CHECK(fit_number(12345.678, 7) == "12345.7");
  CHECK(fit_number(1234567.2, 7) == "1234567");
  CHECK(fit_number(12345678.0, 7) == "1.2e+07");
  CHECK(fit_number(0.004, 6) == "  0.00");
  CHECK(fit_number(123456.0, 6) == "123456");
  CHECK(fit_number(1234567.0, 6) == " 1e+06");
}

TEST_CASE("test values: every reduction of them is exact, so every type gives the same result") {
  for (comm::ReduceOp op : {comm::ReduceOp::sum, comm::ReduceOp::prod, comm::ReduceOp::max, comm::ReduceOp::min}) {
    for (int world : {1, 2, 3, 8, 16}) {
      TestValues v(op, world, 7);
      for (size_t j = 0; j < 2000; ++j) {
        const double exact = v.reduced<double>(j);
        REQUIRE(double(v.reduced<float>(j)) == exact);
        REQUIRE(double(v.reduced<int32_t>(j)) == exact);
        REQUIRE(double(v.reduced<int64_t>(j)) == exact);
        REQUIRE(exact != TestValues::kUnwritten);
      }
    }
  }
  // avg: integers truncate toward zero, floats round once: -7 / 2 is -3 and -3.5.
  TestValues v(comm::ReduceOp::avg, 2, 0);
  for (size_t j = 0; j < 200; ++j) {
    double sum = v.input(0, j) + v.input(1, j);
    CHECK(v.reduced<int32_t>(j) == int32_t(std::trunc(sum / 2)));
    CHECK(v.reduced<float>(j) == float(sum / 2));
  }
  // Different seeds, ranks and positions give different values (no short period to hide a misplaced chunk).
  TestValues a(comm::ReduceOp::sum, 4, 1), b(comm::ReduceOp::sum, 4, 2);
  int same_seed = 0, same_rank = 0, same_shift = 0;
  for (size_t j = 0; j < 1000; ++j) {
    same_seed += a.input(0, j) == b.input(0, j);
    same_rank += a.input(0, j) == a.input(1, j);
    same_shift += a.input(0, j) == a.input(0, j + 256);
  }
  CHECK(same_seed < 50);  // about 1000/101 by chance
  CHECK(same_rank < 50);
  CHECK(same_shift < 50);
}

namespace {

// A world of one whose all-reduce is wrong in a chosen way: the check must see it.
class FaultyGroup : public comm::ProcessGroup {
 public:
  enum class Fault { none, one_element, nothing_written };
  explicit FaultyGroup(Fault fault) : ProcessGroup(0, 1), fault_(fault) {}
  std::string backend() const override { return "faulty"; }
  comm::WorkPtr all_reduce(const Tensor& t, comm::ReduceOp, const comm::CallOptions&) override {
    if (fault_ == Fault::one_element) {
      Tensor w = t;
      w.data<float>()[3] += 1;
    }
    return comm::Work::completed("all_reduce");
  }
  comm::WorkPtr all_reduce_into(const Tensor& out, const Tensor& in, comm::ReduceOp op,
                                const comm::CallOptions& call) override {
    if (fault_ != Fault::nothing_written) Tensor(out).copy_from(in);
    return all_reduce(out, op, call);
  }
  comm::WorkPtr all_reduce_coalesced(const std::vector<Tensor>&, comm::ReduceOp, const comm::CallOptions&) override {
    return done();
  }
  comm::WorkPtr broadcast(const Tensor&, int, const comm::CallOptions&) override { return done(); }
  comm::WorkPtr all_gather(const Tensor&, const Tensor&, const comm::CallOptions&) override { return done(); }
  comm::WorkPtr reduce_scatter(const Tensor&, const Tensor&, comm::ReduceOp, const comm::CallOptions&) override {
    return done();
  }
  comm::WorkPtr barrier(const comm::CallOptions&) override { return done(); }

 private:
  static comm::WorkPtr done() { return comm::Work::completed("unused"); }
  Fault fault_;
};

int64_t wrong_after(FaultyGroup::Fault fault, bool in_place) {
  FaultyGroup group(fault);
  const PerfCollective& c = all_reduce_collective();
  CollectiveCounts counts = c.counts(1000, 4, 1);
  Tensor send = Tensor::empty({1000}), recv = Tensor::empty({1000});
  Placement p = c.place(send, recv, counts, in_place, 0);
  return check_placement(group, c, p, counts, TestValues(comm::ReduceOp::sum, 1, 5), comm::ReduceOp::sum, 0);
}

}  // namespace

TEST_CASE("#wrong counts the elements a collective got wrong, and those it never wrote") {
  CHECK(wrong_after(FaultyGroup::Fault::none, false) == 0);
  CHECK(wrong_after(FaultyGroup::Fault::none, true) == 0);
  CHECK(wrong_after(FaultyGroup::Fault::one_element, false) == 1);
  CHECK(wrong_after(FaultyGroup::Fault::one_element, true) == 1);
  CHECK(wrong_after(FaultyGroup::Fault::nothing_written, false) == 1000);
}
