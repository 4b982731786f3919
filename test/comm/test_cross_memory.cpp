// Ordinary tensors of ranks on one host, read out of the peers' memory and written back into it by
// the kernel (process_vm_readv/writev: comm/algorithms/cross_memory_all_reduce.h). Checked against the reference loop
// and, bit for bit, against the FIFO path (the same group options with TINYDDP_CROSS_MEMORY=0 and
// TINYDDP_STAGING=0; by default the path takes only what tuning.h says, TINYDDP_CROSS_MEMORY=1 more), in
// threads of one process and in separate processes, where the kernel really copies between them.
#include <doctest/doctest.h>

#include <atomic>
#include <thread>

#include "tinyddp/comm/host_backend.h"
#include "tinyddp/comm/store/tcp_store.h"
#include "tinyddp/comm/tuning.h"
#include "test/comm/helpers/child_process.h"
#include "test/comm/test_collectives_support.h"
#include "test/test_support.h"

using namespace tinyddp;
using namespace tinyddp::comm;
using namespace tinyddp::testing;
using namespace std::chrono_literals;

namespace {

HostBackend& host(ProcessGroup& pg) { return dynamic_cast<HostBackend&>(pg); }

}  // namespace

TEST_CASE("ordinary tensors reached with process_vm_readv/writev equal the reference and, bit for bit, the FIFO path") {
  for (int world : {2, 3}) {
    CAPTURE(world);
    // Above the cross-memory threshold (tuning.h), in slices of unequal size that span more than one bounce
    // block (kCrossMemoryBlockBytes): each block is written back to the peers before the next is read.
    const int64_t count = 300007;
    static_assert(300007 / 3 * sizeof(float) > tuning::kCrossMemoryBlockBytes);
    std::vector<std::shared_ptr<ProcessGroup>> cma, fifo;
    {
      ScopedEnv on("TINYDDP_CROSS_MEMORY", "1");
      cma = make_groups(world, shm_group("cma-" + std::to_string(world)));
    }
    {
      ScopedEnv off("TINYDDP_CROSS_MEMORY", "0"), no_staging("TINYDDP_STAGING", "0");
      fifo = make_groups(world, shm_group("cma-off-" + std::to_string(world)));
    }
    run_ranks(world, [&](int r) {
      REQUIRE(host(*cma[size_t(r)]).cross_memory_enabled());
      CHECK_FALSE(host(*fifo[size_t(r)]).cross_memory_enabled());
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
        Tensor a = make_input<float>(op, r, count), b = a.clone();
        cma[size_t(r)]->all_reduce(a, op)->wait();
        fifo[size_t(r)]->all_reduce(b, op)->wait();
        CHECK(a.to_vector<float>() == reference_reduce<float>(op, world, count));
        CHECK(bitwise_equal(a, b));
      }
      Tensor a = order_sensitive_input(r, count), b = a.clone();
      cma[size_t(r)]->all_reduce(a)->wait();
      fifo[size_t(r)]->all_reduce(b)->wait();
      CHECK(bitwise_equal(a, b));
      // Below the threshold the fifos carry it.
      Tensor small = make_input<float>(ReduceOp::sum, r, 100);
      cma[size_t(r)]->all_reduce(small)->wait();
      CHECK(small.to_vector<float>() == reference_reduce<float>(ReduceOp::sum, world, 100));
      CHECK(host(*cma[size_t(r)]).cross_memory_collectives() == 4);
      CHECK(host(*fifo[size_t(r)]).cross_memory_collectives() == 0);
    });
  }
}

TEST_CASE("by default process_vm_readv carries ordinary tensors from the size tuning.h names, the fifos below it") {
  constexpr int kWorld = 2;
  ScopedEnv unset("TINYDDP_CROSS_MEMORY", nullptr);
  auto groups = make_groups(kWorld, shm_group("cma-default"));
  const int64_t below = int64_t(tuning::kCrossMemoryDefaultBytes / sizeof(float)) - 1, from = below + 1;
  // An algorithm the user names runs as named, whatever the size.
  ProcessGroupOptions halving = shm_group("cma-default-rabenseifner");
  halving.algorithm = "rabenseifner";
  auto named = make_groups(kWorld, halving);
  run_ranks(kWorld, [&](int r) {
    ProcessGroup& pg = *groups[size_t(r)];
    REQUIRE(host(pg).cross_memory_enabled());
    for (int64_t count : {below, from}) {
      Tensor t = make_input<float>(ReduceOp::sum, r, count);
      pg.all_reduce(t)->wait();
      CHECK(t.to_vector<float>() == reference_reduce<float>(ReduceOp::sum, kWorld, count));
      CHECK(host(pg).cross_memory_collectives() == (count == below ? 0u : 1u));
    }
    Tensor t = make_input<float>(ReduceOp::sum, r, from);
    named[size_t(r)]->all_reduce(t)->wait();
    CHECK(t.to_vector<float>() == reference_reduce<float>(ReduceOp::sum, kWorld, from));
    CHECK(host(*named[size_t(r)]).cross_memory_collectives() == 0);
  });
}

// A rank that fails out of a collective while a peer is still in it: the peer writes its reduced
// slice into this rank's tensor (process_vm_writev) after this rank has given up, so the tensor's
// memory must not have been handed to anything else by then. Here rank 0 times out before rank 1
// arrives; rank 1 then finds rank 0's arrival published, reduces and writes into rank 0's tensor,
// and fails only at the last barrier. Meanwhile rank 0 frees its tensor and takes a new one of the
// same size, which the CPU block cache would give the same memory: it must keep its values.
TEST_CASE("a rank that left a collective through the kernel after a failure keeps its tensor's memory from others") {
  constexpr int64_t kCount = 1 << 18;
  std::vector<std::shared_ptr<ProcessGroup>> groups;
  {
    ScopedEnv on("TINYDDP_CROSS_MEMORY", "1");
    groups = make_groups(2, shm_group("cma-left", 300ms));
  }
  std::atomic<bool> rank0_failed{false}, rank1_done{false};
  // Each rank waits for the other's step for at most 30 s, so that a rank that fails early cannot
  // leave the other waiting for ever.
  const auto await = [](const std::atomic<bool>& flag, const char* what) {
    const auto give_up = Clock::now() + 30s;
    while (!flag && Clock::now() < give_up) std::this_thread::sleep_for(1ms);
    REQUIRE_MESSAGE(flag, "waited 30 s for ", what);
  };
  run_ranks(2, [&](int r) {
    REQUIRE(host(*groups[size_t(r)]).cross_memory_enabled());
    if (r == 0) {
      {
        Tensor t = Tensor::from_vector(std::vector<float>(size_t(kCount), 1.0f));
        CHECK_THROWS_WITH(groups[0]->all_reduce(t)->wait(), doctest::Contains("timed out"));
      }
      Tensor next = Tensor::from_vector(std::vector<float>(size_t(kCount), 7.0f));
      rank0_failed = true;
      await(rank1_done, "rank 1 to finish its call");
      CHECK(next.to_vector<float>() == std::vector<float>(size_t(kCount), 7.0f));
    } else {
      await(rank0_failed, "rank 0 to fail its call");
      Tensor t = Tensor::from_vector(std::vector<float>(size_t(kCount), 2.0f));
      CHECK_THROWS(groups[1]->all_reduce(t)->wait());
      // It did reach rank 0's memory: its own half holds the sum.
      CHECK(t.to_vector<float>()[size_t(kCount) - 1] == 3.0f);
      rank1_done = true;
    }
  });
}

TEST_CASE("ranks in separate processes read each other's tensors with process_vm_readv") {
  TINYDDP_SKIP_UNDER_TSAN();  // the ranks are spawn_child lambdas: forked, no exec
  constexpr int kWorld = 3;
  constexpr int64_t kCount = 1 << 18;
  TcpStore server("127.0.0.1", 0, true);
  std::vector<Child> children;
  for (int r = 0; r < kWorld; ++r)
    children.push_back(spawn_child([&, r](std::string& report) {
      auto store = std::make_shared<TcpStore>("127.0.0.1", server.port(), false);
      ScopedEnv on("TINYDDP_CROSS_MEMORY", "1");
      auto pg = create_process_group("host", store, r, kWorld, shm_group("cma-processes"));
      Tensor t = make_input<float>(ReduceOp::sum, r, kCount);
      for (int i = 0; i < 3; ++i) {
        t.copy_from(make_input<float>(ReduceOp::sum, r, kCount));
        pg->all_reduce(t)->wait();
      }
      const bool exact = t.to_vector<float>() == reference_reduce<float>(ReduceOp::sum, kWorld, kCount);
      // Where ptrace permission forbids it (Yama), the fifos carry every call instead.
      const bool enabled = host(*pg).cross_memory_enabled();
      const uint64_t taken = host(*pg).cross_memory_collectives();
      report = "exact " + std::to_string(exact) + ", cross-memory " + (enabled ? "enabled" : "refused") +
               ", collectives over it " + std::to_string(taken);
      return exact && taken == (enabled ? 3u : 0u) ? 0 : 3;
    }));
  for (int r = 0; r < kWorld; ++r) {
    ChildOutcome outcome = finish_child(children[size_t(r)], Clock::now() + 30s);
    CHECK_MESSAGE(outcome.ok(), "rank ", r, ": ", outcome.describe());
  }
}
