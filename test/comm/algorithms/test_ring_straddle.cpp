// A reduction reads incoming bytes in place, out of the transport's circular buffer (the shm fifo,
// the tcp inbox), one whole element at a time. After traffic in a smaller dtype (here one i32 each
// way) the stream's position in that buffer is no multiple of 8, so some f64 element of a later
// reduction starts before the buffer's end and finishes at its start: no look at the buffer shows it
// whole. Found by test/soak/collective_soak (4 ranks,
// a reduce_scatter of f64 after odd i32 counts: every rank waited for the next until the timeout).
#include <doctest/doctest.h>

#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "tinyddp/comm/process_group.h"
#include "test/comm/test_collectives_support.h"

using namespace tinyddp;
using namespace tinyddp::comm;
using namespace tinyddp::testing;

TEST_CASE(
    "an f64 reduction whose elements straddle the end of the transport's buffer (after an odd i32 count) is exact") {
  const int world = 2;
  // Over shared memory the fifo is made small (32 KiB, below the size from which a large
  // collective's stream is aligned to a place in a page, which would take the straddle away); over
  // TCP the inbox is the transport's 4 MiB, so 1 Mi f64 (8 MiB: 4 MiB reduced on each rank, then
  // 4 MiB gathered) wraps it.
  for (std::string transport : {"shm", "tcp"}) {
    CAPTURE(transport);
    ProcessGroupOptions options;
    options.transport = transport;
    options.group_name = "straddle-" + transport;
    options.timeout = std::chrono::seconds(20);
    options.shm_fifo_bytes = 32 << 10;
    auto groups = make_groups(world, options);
    const int64_t count = int64_t(1) << 20;
    std::vector<std::string> errors(world);
    run_ranks(world, [&](int r) {
      ProcessGroup& pg = *groups[size_t(r)];
      // 4 bytes each way: every later position in the ring is 4 past a multiple of 8.
      Tensor one = Tensor::from_vector(std::vector<int32_t>{r}), both = Tensor::empty({world}, DType::i32);
      pg.all_gather(both, one)->wait();
      std::vector<double> values(static_cast<size_t>(count));
      for (int64_t i = 0; i < count; ++i) values[size_t(i)] = double((i % 13) * (r + 1));
      Tensor sum = Tensor::from_vector(values);
      pg.all_reduce(sum)->wait();
      Tensor part = Tensor::empty({count / world}, DType::f64);
      pg.reduce_scatter(part, Tensor::from_vector(values))->wait();
      std::string& error = errors[size_t(r)];
      for (int64_t i = 0; i < count && error.empty(); ++i)
        if (sum.data<double>()[i] != double((i % 13) * 3))
          error = "all_reduce: rank " + std::to_string(r) + " element " + std::to_string(i) + " = " +
                  std::to_string(sum.data<double>()[i]);
      for (int64_t i = 0; i < count / world && error.empty(); ++i)
        if (part.data<double>()[i] != double(((r * count / world + i) % 13) * 3))
          error = "reduce_scatter: rank " + std::to_string(r) + " element " + std::to_string(i);
    });
    for (auto& e : errors) CHECK_MESSAGE(e.empty(), e);
  }
}

TEST_CASE("two ranks' small all-reduces fold f64s that straddle the ring's end, and agree bitwise on NaNs") {
  // The two-rank direct path folds the peer's bytes where they lie in the shared-memory fifo. After
  // one i32 each way the stream is 4 past a multiple of 8, and a 32 KiB fifo is wrapped every few
  // calls, so f64 elements are cut by its end again and again.
  ProcessGroupOptions options;
  options.transport = "shm";
  options.group_name = "pair-straddle";
  options.timeout = std::chrono::seconds(20);
  options.shm_fifo_bytes = 32 << 10;
  auto groups = make_groups(2, options);
  std::vector<std::string> errors(2);
  std::vector<std::vector<double>> maxima(2), minima(2);
  run_ranks(2, [&](int r) {
    ProcessGroup& pg = *groups[size_t(r)];
    Tensor one = Tensor::from_vector(std::vector<int32_t>{r}), both = Tensor::empty({2}, DType::i32);
    pg.all_gather(both, one)->wait();
    for (int call = 0; call < 100 && errors[size_t(r)].empty(); ++call) {
      std::vector<double> values(1001);
      for (size_t i = 0; i < values.size(); ++i) values[i] = double((i + size_t(call)) % 17) * (r + 1);
      Tensor t = Tensor::from_vector(values);
      if (call % 2 == 0) {
        pg.all_reduce(t)->wait();
      } else {
        Tensor out = Tensor::empty({1001}, DType::f64);
        pg.all_reduce_into(out, t)->wait();
        t = out;
      }
      for (size_t i = 0; i < values.size(); ++i)
        if (t.data<double>()[i] != double((i + size_t(call)) % 17) * 3) {
          errors[size_t(r)] = "call " + std::to_string(call) + " rank " + std::to_string(r) + " element " +
                              std::to_string(i);
          break;
        }
    }
    // max and min are not symmetric when one side is NaN (x < NaN and NaN < x are both false), so
    // the ranks agree only if both fold in rank order: x0 op x1.
    const double nan = std::numeric_limits<double>::quiet_NaN();
    std::vector<double> mine = r == 0 ? std::vector<double>{nan, 1.0, nan, -2.0}
                                      : std::vector<double>{1.0, nan, nan, 5.0};
    Tensor mx = Tensor::from_vector(mine), mn = Tensor::from_vector(mine);
    pg.all_reduce(mx, ReduceOp::max)->wait();
    pg.all_reduce(mn, ReduceOp::min)->wait();
    maxima[size_t(r)] = mx.to_vector<double>();
    minima[size_t(r)] = mn.to_vector<double>();
  });
  for (auto& e : errors) CHECK_MESSAGE(e.empty(), e);
  auto same_bits = [](const std::vector<double>& a, const std::vector<double>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
  };
  CHECK(same_bits(maxima[0], maxima[1]));
  CHECK(same_bits(minima[0], minima[1]));
  CHECK(maxima[0][3] == 5.0);
  CHECK(minima[0][3] == -2.0);
}
