// Small all-reduces inside a host through slots in symmetric memory (comm/algorithms/slot_all_reduce.h).
//
// Checked against the reference loop and, bit for bit, against the direct exchange over the FIFOs
// (the same group options with TINYDDP_SLOTS=0: a second implementation that folds in the same
// order). The slots alternate between calls with no barrier at the end of a call, so the tests run
// many calls back to back with values that change every call: a rank that overwrote a slot its
// peers still read would show as a wrong sum.
#include <doctest/doctest.h>

#include "tinyddp/comm/host_backend.h"
#include "test/comm/test_collectives_support.h"
#include "test/test_support.h"

using namespace tinyddp;
using namespace tinyddp::comm;
using namespace tinyddp::testing;
using namespace std::chrono_literals;

namespace {

HostBackend& host(ProcessGroup& pg) { return dynamic_cast<HostBackend&>(pg); }

}  // namespace

TEST_CASE("small all-reduces through the slots equal the reference and, bit for bit, the direct exchange") {
  for (int world : {2, 3, 4}) {
    CAPTURE(world);
    auto slots = make_groups(world, shm_group("slots-" + std::to_string(world)));
    std::vector<std::shared_ptr<ProcessGroup>> fifo;
    {
      ScopedEnv off("TINYDDP_SLOTS", "0");
      fifo = make_groups(world, shm_group("slots-off-" + std::to_string(world)));
    }
    run_ranks(world, [&](int r) {
      ProcessGroup& pg = *slots[size_t(r)];
      REQUIRE(host(pg).slots_enabled());
      CHECK_FALSE(host(*fifo[size_t(r)]).slots_enabled());
      for (int64_t count : {int64_t(1), int64_t(7), int64_t(1000), int64_t(8192)}) {  // 8192 floats: a whole slot
        CAPTURE(count);
        for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
          Tensor a = make_input<float>(op, r, count), b = a.clone();
          pg.all_reduce(a, op)->wait();
          fifo[size_t(r)]->all_reduce(b, op)->wait();
          CHECK(a.to_vector<float>() == reference_reduce<float>(op, world, count));
          CHECK(bitwise_equal(a, b));
        }
        // Out of place, and a dtype of another size (at most a slot's bytes).
        const int64_t wide = std::min<int64_t>(count, 4096);
        Tensor in = make_input<int64_t>(ReduceOp::sum, r, wide), out = Tensor::zeros({wide}, DType::i64);
        pg.all_reduce_into(out, in)->wait();
        CHECK(out.to_vector<int64_t>() == reference_reduce<int64_t>(ReduceOp::sum, world, wide));
        CHECK(in.to_vector<int64_t>() == make_input<int64_t>(ReduceOp::sum, r, wide).to_vector<int64_t>());
      }
      // Many calls back to back, each with its own order-sensitive values.
      for (int call = 0; call < 200; ++call) {
        Tensor a = order_sensitive_input(r, 300, call), b = a.clone();
        pg.all_reduce(a)->wait();
        fifo[size_t(r)]->all_reduce(b)->wait();
        if (!bitwise_equal(a, b)) FAIL_CHECK("call ", call, " differs from the direct exchange");
      }
      CHECK(host(pg).slot_collectives() == 4 * 4 + 200);
      CHECK(host(*fifo[size_t(r)]).slot_collectives() == 0);
    });
  }
}

TEST_CASE("the slots take small all-reduces only: larger ones keep their own paths") {
  auto groups = make_groups(2, shm_group("slots-sizes"));
  run_ranks(2, [&](int r) {
    ProcessGroup& pg = *groups[size_t(r)];
    Tensor big = make_input<float>(ReduceOp::sum, r, 100000);  // above the direct exchange's sizes
    pg.all_reduce(big)->wait();
    CHECK(big.to_vector<float>() == reference_reduce<float>(ReduceOp::sum, 2, 100000));
    CHECK(host(pg).slot_collectives() == 0);
    Tensor sym = pg.allocate_symmetric({100});  // symmetric memory, small: the slots
    for (int64_t i = 0; i < 100; ++i) sym.data<float>()[i] = float(input_value(ReduceOp::sum, r, i));
    pg.all_reduce(sym)->wait();
    CHECK(sym.to_vector<float>() == reference_reduce<float>(ReduceOp::sum, 2, 100));
    CHECK(host(pg).slot_collectives() == 1);
    pg.barrier()->wait();  // a barrier is a one-element all-reduce
    CHECK(host(pg).slot_collectives() == 2);
  });
}

TEST_CASE("ranks that make different small all-reduces are told who differs") {
  auto groups = make_groups(2, shm_group("slots-mismatch"));
  std::vector<std::string> errors(2);
  run_ranks(2, [&](int r) {
    try {
      groups[size_t(r)]->all_reduce(Tensor::zeros({r == 0 ? 10 : 12}))->wait();
    } catch (const Error& e) {
      errors[size_t(r)] = e.what();
    }
  });
  // Each rank's error describes both calls: its own finding, or the first rank's, passed on as the
  // root cause when that rank aborted first (which of the two comes is a race).
  for (const std::string& error : errors) {
    INFO(error);
    CHECK(error.find("is in collective #0 on ") != std::string::npos);
    CHECK(error.find(" 10 elements of f32") != std::string::npos);
    CHECK(error.find(" 12 elements of f32") != std::string::npos);
  }
}

TEST_CASE("a rank that never comes to a small all-reduce is named when the wait times out") {
  auto groups = make_groups(2, shm_group("slots-timeout", 300ms));
  std::string error;
  run_ranks(2, [&](int r) {
    if (r == 1) return;
    try {
      groups[0]->all_reduce(Tensor::zeros({16}))->wait();
    } catch (const Error& e) {
      error = e.what();
    }
  });
  CHECK(error.find("timed out after 300 ms waiting for rank(s) 1 to arrive at this collective") != std::string::npos);
}
