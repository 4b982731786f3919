// A reduction reads incoming bytes in place, out of the transport's ring, one whole element at a
// time. After traffic in a smaller dtype (here one i32 each way) the stream's position in that ring
// is no multiple of 8, so some f64 element of a later reduction starts before the ring's end and
// finishes at its start: no look at the ring shows it whole. Found by bench/collective_soak (4 ranks,
// a reduce_scatter of f64 after odd i32 counts: every rank waited for the next until the timeout).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "comm/process_group.h"
#include "test/comm/test_collectives_support.h"

using namespace tinyddp;
using namespace tinyddp::comm;
using namespace tinyddp::testing;

TEST_CASE("an f64 reduction whose elements straddle the end of the transport's ring (after an odd i32 count) is exact") {
  const int world = 2;
  // Over shared memory the ring is made small (64 KiB); over TCP it is the transport's 4 MiB, so
  // 1 Mi f64 (8 MiB: 4 MiB reduced on each rank, then 4 MiB gathered) wraps it.
  for (std::string transport : {"shm", "tcp"}) {
    CAPTURE(transport);
    ProcessGroupOptions options;
    options.transport = transport;
    options.group_name = "straddle-" + transport;
    options.timeout = std::chrono::seconds(20);
    options.shm_ring_bytes = 64 << 10;
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
          error = "all_reduce: rank " + std::to_string(r) + " element " + std::to_string(i) + " = " + std::to_string(sum.data<double>()[i]);
      for (int64_t i = 0; i < count / world && error.empty(); ++i)
        if (part.data<double>()[i] != double(((r * count / world + i) % 13) * 3))
          error = "reduce_scatter: rank " + std::to_string(r) + " element " + std::to_string(i);
    });
    for (auto& e : errors) CHECK_MESSAGE(e.empty(), e);
  }
}
