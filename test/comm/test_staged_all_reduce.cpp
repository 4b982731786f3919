// Large all-reduces of ordinary tensors inside a host, staged through symmetric memory
// (comm/algorithms/staged_all_reduce.h).
//
// Checked against the reference loop and, bit for bit, against the FIFO ring: the same group options
// with TINYDDP_STAGING=0 (the fifos) against TINYDDP_STAGING=1 (the default, tuning.h), a second implementation
// whose fold order the staging keeps element by element. The sizes take several rounds of the staging
// (tuning::kStagingHalfBytes) with slices of unequal size, and the calls follow each other with no barrier between
// them, so a rank that wrote a staging half its peers still read would show as a wrong result.
#include <doctest/doctest.h>

#include "tinyddp/comm/host_backend.h"
#include "tinyddp/comm/tuning.h"
#include "test/comm/test_collectives_support.h"
#include "test/test_support.h"

using namespace tinyddp;
using namespace tinyddp::comm;
using namespace tinyddp::testing;
using namespace std::chrono_literals;

namespace {

HostBackend& host(ProcessGroup& pg) { return dynamic_cast<HostBackend&>(pg); }

}  // namespace

TEST_CASE("large all-reduces staged through symmetric memory equal the reference and, bit for bit, the FIFO ring") {
  // Several rounds: more elements per slice than a staging half holds, and a count no rank count divides.
  const int64_t count = int64_t(3 * tuning::kStagingHalfBytes / sizeof(float)) + 7;
  for (int world : {2, 3, 4}) {
    CAPTURE(world);
    std::vector<std::shared_ptr<ProcessGroup>> staged, fifo;
    {
      ScopedEnv on("TINYDDP_STAGING", "1");
      staged = make_groups(world, shm_group("staged-" + std::to_string(world)));
    }
    {
      ScopedEnv off("TINYDDP_STAGING", "0");
      fifo = make_groups(world, shm_group("staged-off-" + std::to_string(world)));
    }
    run_ranks(world, [&](int r) {
      ProcessGroup& pg = *staged[size_t(r)];
      REQUIRE(host(pg).staging_enabled());
      CHECK_FALSE(host(*fifo[size_t(r)]).staging_enabled());
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::prod}) {
        Tensor a = make_input<float>(op, r, count), b = a.clone();
        pg.all_reduce(a, op)->wait();
        fifo[size_t(r)]->all_reduce(b, op)->wait();
        CHECK(a.to_vector<float>() == reference_reduce<float>(op, world, count));
        CHECK(bitwise_equal(a, b));
      }
      // Out of place, another dtype, and a size of one round only.
      Tensor in = make_input<int64_t>(ReduceOp::sum, r, 40001), out = Tensor::zeros({40001}, DType::i64);
      pg.all_reduce_into(out, in)->wait();
      CHECK(out.to_vector<int64_t>() == reference_reduce<int64_t>(ReduceOp::sum, world, 40001));
      CHECK(in.to_vector<int64_t>() == make_input<int64_t>(ReduceOp::sum, r, 40001).to_vector<int64_t>());
      // Calls back to back, each with its own order-sensitive values, one and several rounds long.
      for (int call = 0; call < 12; ++call) {
        Tensor a = order_sensitive_input(r, call % 2 ? count : 20000, call), b = a.clone();
        pg.all_reduce(a)->wait();
        fifo[size_t(r)]->all_reduce(b)->wait();
        if (!bitwise_equal(a, b)) FAIL_CHECK("call ", call, " differs from the FIFO ring");
      }
      CHECK(host(pg).staged_collectives() == 4 + 1 + 12);
      CHECK(host(*fifo[size_t(r)]).staged_collectives() == 0);
    });
  }
}

TEST_CASE(
    "by default an ordinary tensor is staged from 64 KiB and goes through the kernel from the size tuning.h names, "
    "where it may") {
  std::vector<std::shared_ptr<ProcessGroup>> groups;
  {
    ScopedEnv staging("TINYDDP_STAGING", nullptr), cross_memory("TINYDDP_CROSS_MEMORY", nullptr);
    groups = make_groups(2, shm_group("staged-default"));
  }
  const auto elements = [](size_t bytes) { return int64_t(bytes / sizeof(float)); };
  run_ranks(2, [&](int r) {
    HostBackend& pg = host(*groups[size_t(r)]);
    REQUIRE(pg.staging_enabled());
    // Below the staging's size the fifos take it (the slots take only small messages); from it up to the kernel's size,
    // the staging.
    for (int64_t count : {elements(tuning::kStagedAllReduceBytes) - 1, elements(tuning::kStagedAllReduceBytes),
                          elements(tuning::kCrossMemoryDefaultBytes) - 1}) {
      Tensor t = make_input<float>(ReduceOp::sum, r, count);
      pg.all_reduce(t)->wait();
      CHECK(t.to_vector<float>() == reference_reduce<float>(ReduceOp::sum, 2, count));
    }
    CHECK(pg.staged_collectives() == 2);
    CHECK(pg.cross_memory_collectives() == 0);
    // From the kernel's size: process_vm_readv where the ranks may read each other, else still staged.
    Tensor t = make_input<float>(ReduceOp::sum, r, elements(tuning::kCrossMemoryDefaultBytes));
    pg.all_reduce(t)->wait();
    CHECK(pg.staged_collectives() == (pg.cross_memory_enabled() ? 2 : 3));
    CHECK(pg.cross_memory_collectives() == (pg.cross_memory_enabled() ? 1 : 0));
  });
}

TEST_CASE("ranks that stage different all-reduces are told who differs") {
  std::vector<std::shared_ptr<ProcessGroup>> groups;
  {
    ScopedEnv on("TINYDDP_STAGING", "1");
    groups = make_groups(2, shm_group("staged-mismatch"));
  }
  std::vector<std::string> errors(2);
  run_ranks(2, [&](int r) {
    try {
      groups[size_t(r)]->all_reduce(Tensor::zeros({r == 0 ? 100000 : 100004}))->wait();
    } catch (const Error& e) {
      errors[size_t(r)] = e.what();
    }
  });
  // Each rank's error describes both calls: its own finding, or the first rank's, passed on as the
  // root cause when that rank aborted first (which of the two comes is a race).
  for (const std::string& error : errors) {
    INFO(error);
    CHECK(error.find("is in collective #0 on ") != std::string::npos);
    CHECK(error.find(" 100000 elements of f32") != std::string::npos);
    CHECK(error.find(" 100004 elements of f32") != std::string::npos);
  }
}
