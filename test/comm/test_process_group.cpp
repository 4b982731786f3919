// ProcessGroup behaviour around the data: asynchronous Work, timeouts that name the missing rank,
// the TINYDDP_DEBUG=DETAIL fingerprint check, argument errors and backend selection.
#include <doctest/doctest.h>

#include <future>
#include <thread>

#include "tinyddp/comm/host_backend.h"
#include "tinyddp/comm/tuning.h"
#include "tinyddp/core/cuda_runtime.h"
#include "tinyddp/core/error.h"
#include "test/comm/test_collectives_support.h"
#include "test/test_skip.h"

using namespace tinyddp;
using namespace tinyddp::comm;
using namespace std::chrono_literals;
using tinyddp::testing::make_groups;
using tinyddp::testing::run_ranks;

namespace {

ProcessGroupOptions options(const std::string& name, bool detail = false, const std::string& transport = "auto") {
  ProcessGroupOptions o;
  o.group_name = name;
  o.timeout = 20s;
  o.debug_detail = detail;
  o.transport = transport;
  return o;
}

// Runs body(rank) on every rank and returns each rank's error text ("" when it did not throw).
std::vector<std::string> errors_of(int world, const std::function<void(int)>& body) {
  std::vector<std::string> errors(static_cast<size_t>(world));
  run_ranks(world, [&](int r) {
    try {
      body(r);
    } catch (const std::exception& e) {
      errors[size_t(r)] = e.what();
    }
  });
  return errors;
}

}  // namespace

TEST_CASE("a collective returns before it completes, and completes once every rank has called it") {
  auto groups = make_groups(2, options("async"));
  std::promise<void> rank0_checked;
  bool completed_right_after_call = true;
  run_ranks(2, [&](int r) {
    Tensor t = Tensor::from_vector(std::vector<float>{float(r + 1), 10.f});
    if (r == 0) {
      auto work = groups[0]->all_reduce(t);
      // Rank 1 has not called yet (it waits for this promise), so this cannot be complete.
      completed_right_after_call = work->is_completed();
      rank0_checked.set_value();
      work->wait();
      CHECK(work->is_completed());
      CHECK(work->is_success());
      CHECK(work->exception() == nullptr);
    } else {
      rank0_checked.get_future().wait();
      groups[1]->all_reduce(t)->wait();
    }
    CHECK(t.to_vector<float>() == std::vector<float>{3.f, 20.f});
  });
  CHECK_FALSE(completed_right_after_call);
}

TEST_CASE("a queued collective holds its own tensor handles: the caller may let go of its handles first") {
  // A call its caller runs at once borrows the caller's handles; one that is queued must not, since
  // the caller may return, and drop them, before it runs.
  auto groups = make_groups(2, options("held"));
  std::promise<void> rank0_let_go;
  run_ranks(2, [&](int r) {
    Tensor keep = Tensor::from_vector(std::vector<float>(1000, float(r + 1)));
    Tensor out = Tensor::zeros({1000});
    WorkPtr work, into;
    if (r == 0) {
      // Temporaries: the handles passed die at the end of each statement, before rank 1 calls.
      work = groups[0]->all_reduce(Tensor(keep));
      into = groups[0]->all_reduce_into(Tensor(out), Tensor(keep));
      rank0_let_go.set_value();
    } else {
      rank0_let_go.get_future().wait();
      work = groups[1]->all_reduce(keep);
      into = groups[1]->all_reduce_into(out, keep);
    }
    work->wait();
    into->wait();
    CHECK(keep.to_vector<float>() == std::vector<float>(1000, 3.f));
    CHECK(out.to_vector<float>() == std::vector<float>(1000, 6.f));
  });
}

TEST_CASE("wait_for gives up after its own timeout while the collective goes on") {
  auto groups = make_groups(2, options("wait-for"));
  std::promise<void> gave_up;
  run_ranks(2, [&](int r) {
    Tensor t = Tensor::from_vector(std::vector<int64_t>{r + 1});
    if (r == 0) {
      auto work = groups[0]->all_reduce(t);
      CHECK_FALSE(work->wait_for(50ms));  // rank 1 only calls after this
      gave_up.set_value();
      CHECK(work->wait_for(20s));
    } else {
      gave_up.get_future().wait();
      groups[1]->all_reduce(t)->wait();
    }
    CHECK(t.item<int64_t>() == 3);
  });
}

TEST_CASE("collectives queued back to back run in call order") {
  auto groups = make_groups(3, options("order"));
  run_ranks(3, [&](int r) {
    std::vector<Tensor> tensors;
    std::vector<WorkPtr> works;
    for (int i = 0; i < 20; ++i) {
      tensors.push_back(Tensor::from_vector(std::vector<int32_t>(size_t(i * 997 + 1), r * 100 + i)));
      works.push_back(i % 2 ? groups[size_t(r)]->all_reduce(tensors.back(), ReduceOp::max)
                            : groups[size_t(r)]->all_reduce(tensors.back()));
    }
    for (auto& w : works) w->wait();
    for (int i = 0; i < 20; ++i) {
      int32_t want = i % 2 ? 200 + i : (0 + 100 + 200) + 3 * i;
      CHECK(tensors[size_t(i)].item<int32_t>(0) == want);
      CHECK(tensors[size_t(i)].item<int32_t>(tensors[size_t(i)].numel() - 1) == want);
    }
  });
}

TEST_CASE("a caller that waits for each small collective runs it itself; one it then leaves unawaited still runs") {
  for (const std::string transport : {"shm", "tcp"}) {
    CAPTURE(transport);
    auto groups = make_groups(2, options("blocking-caller-" + transport, false, transport));
    std::promise<void> rank0_called;
    run_ranks(2, [&](int r) {
      auto& group = dynamic_cast<HostBackend&>(*groups[size_t(r)]);
      // The blocking caller's pattern: each small all-reduce awaited before the next is called.
      for (int i = 0; i < 100; ++i) {
        Tensor t = Tensor::from_vector(std::vector<float>{float(r + i), 1.f});
        group.all_reduce(t)->wait();
        REQUIRE(t.to_vector<float>() == std::vector<float>{float(2 * i + 1), 2.f});
      }
      // Most of them ran on the caller's own thread (the first few, before the pattern is known,
      // and any the thread's periodic look caught first, on the communication thread). The thread
      // takes one only after it has waited a whole poll period (tuning::kBlockingCallerPoll)
      // unclaimed, which needs the caller to be descheduled between its call and its wait; a
      // quarter leaves room for a loaded machine doing that often.
      auto counts = group.collectives_run();
      CAPTURE(counts.by_thread);
      CHECK(counts.by_caller >= 25);
      // Now rank 0 calls and does not wait: rank 1 only calls once rank 0 says so. Nobody runs rank
      // 0's collective for it, so its communication thread must start it by itself.
      Tensor t = Tensor::from_vector(std::vector<int32_t>{r + 1});
      if (r == 0) {
        auto work = group.all_reduce(t);
        rank0_called.set_value();
        auto give_up = std::chrono::steady_clock::now() + 10s;
        while (!work->is_completed() && std::chrono::steady_clock::now() < give_up) std::this_thread::sleep_for(1ms);
        CHECK(work->is_completed());
        CHECK(work->is_success());
      } else {
        rank0_called.get_future().wait();
        group.all_reduce(t)->wait();
      }
      CHECK(t.item<int32_t>(0) == 3);
    });
  }
}

TEST_CASE(
    "a blocking call returns once its collective is done, after the ones queued before it, and throws its error") {
  for (const std::string transport : {"shm", "tcp"}) {
    CAPTURE(transport);
    auto groups = make_groups(2, options("blocking-call-" + transport, false, transport));
    CallOptions blocking;
    blocking.blocking = true;
    run_ranks(2, [&](int r) {
      auto& group = dynamic_cast<HostBackend&>(*groups[size_t(r)]);
      const auto before = group.collectives_run();
      for (int i = 0; i < 50; ++i) {
        Tensor t = Tensor::from_vector(std::vector<float>{float(r + i), 1.f});
        WorkPtr work = group.all_reduce(t, ReduceOp::sum, blocking);
        CHECK(work->is_success());  // done when the call returns, with no wait
        CHECK(t.to_vector<float>() == std::vector<float>{float(2 * i + 1), 2.f});
      }
      // Nothing was queued before them: they ran on the caller's thread, but for the first few, which a
      // communication thread still polling after the group's setup may take.
      CHECK(group.collectives_run().by_caller - before.by_caller >= 40);
      // Behind collectives that were not waited for, it runs after them, in call order.
      std::vector<Tensor> queued;
      std::vector<WorkPtr> works;
      for (int i = 0; i < 5; ++i) {
        queued.push_back(Tensor::from_vector(std::vector<int64_t>(5000, (r + 1) * (i + 1))));
        works.push_back(group.all_reduce(queued.back()));
      }
      Tensor last = Tensor::from_vector(std::vector<int64_t>{r + 10});
      group.all_reduce(last, ReduceOp::max, blocking);
      CHECK(last.item<int64_t>(0) == 11);
      for (int i = 0; i < 5; ++i) {
        CHECK(works[size_t(i)]->is_success());
        CHECK(queued[size_t(i)].item<int64_t>(4999) == 3 * (i + 1));
      }
    });
  }
  // Its error comes from the call itself: here a peer that never makes it.
  auto groups = make_groups(2, options("blocking-call-error", false, "shm"));
  CallOptions blocking;
  blocking.blocking = true;
  blocking.timeout = 300ms;
  Tensor t = Tensor::zeros({16});
  CHECK_THROWS_WITH_AS(groups[0]->all_reduce(t, ReduceOp::sum, blocking), doctest::Contains("timed out after 300 ms"),
                       Error);
}

TEST_CASE("a rank that never calls makes the others time out with an error naming it") {
  for (std::string transport : {"shm", "tcp"}) {
    CAPTURE(transport);
    auto groups = make_groups(3, options("timeout-" + transport, false, transport));
    auto errors = errors_of(3, [&](int r) {
      if (r == 2) return;  // rank 2 skips the collective
      Tensor t = Tensor::zeros({16});
      CallOptions call;
      call.timeout = 300ms;
      groups[size_t(r)]->all_reduce(t, ReduceOp::sum, call)->wait();
    });
    for (int r = 0; r < 2; ++r) {
      CHECK_MESSAGE(errors[size_t(r)].find("timed out after 300 ms") != std::string::npos, errors[size_t(r)]);
      CHECK_MESSAGE(errors[size_t(r)].find("rank(s) 2") != std::string::npos, errors[size_t(r)]);
      CHECK(errors[size_t(r)].find("hint:") != std::string::npos);
    }
    CHECK(errors[2].empty());
    // The group is aborted now: the next call fails at once and says why.
    Tensor t = Tensor::zeros({4});
    CHECK_THROWS_WITH_AS(groups[0]->all_reduce(t)->wait(), doctest::Contains("aborted by an earlier failure"), Error);
  }
}

TEST_CASE("TINYDDP_DEBUG=DETAIL: mismatched collectives raise the same error on every rank, listing who differs") {
  auto groups = make_groups(3, options("detail", true));
  SUBCASE("element count") {
    auto errors = errors_of(3, [&](int r) {
      Tensor t = Tensor::zeros({r == 1 ? 5 : 4});
      groups[size_t(r)]->all_reduce(t)->wait();
    });
    for (auto& e : errors) {
      CHECK_MESSAGE(e.find("collective mismatch") != std::string::npos, e);
      CHECK_MESSAGE(e.find("ranks 0, 2 call all_reduce #0 f32 x4 sum") != std::string::npos, e);
      CHECK_MESSAGE(e.find("rank 1 calls all_reduce #0 f32 x5 sum") != std::string::npos, e);
      CHECK_MESSAGE(e.find("differ in element count") != std::string::npos, e);
    }
  }
  SUBCASE("collective, dtype and op") {
    auto errors = errors_of(3, [&](int r) {
      if (r == 0) {
        Tensor t = Tensor::zeros({4}, DType::f64);
        groups[0]->all_reduce(t, ReduceOp::max)->wait();
      } else if (r == 1) {
        Tensor t = Tensor::zeros({4});
        groups[1]->broadcast(t, 0)->wait();
      } else {
        Tensor t = Tensor::zeros({4});
        groups[2]->all_reduce(t)->wait();
      }
    });
    for (auto& e : errors) {
      CHECK_MESSAGE(e.find("rank 0 calls all_reduce #0 f64 x4 max") != std::string::npos, e);
      CHECK_MESSAGE(e.find("rank 1 calls broadcast #0 f32 x4 root 0") != std::string::npos, e);
      CHECK_MESSAGE(e.find("collective, dtype, reduce op, root") != std::string::npos, e);
    }
  }
  // A mismatch leaves the streams in step: the group stays usable for matching calls.
  auto errors = errors_of(3, [&](int r) {
    Tensor t = Tensor::from_vector(std::vector<float>{1.f, 2.f});
    groups[size_t(r)]->all_reduce(t)->wait();
    CHECK(t.to_vector<float>() == std::vector<float>{3.f, 6.f});
  });
  for (auto& e : errors) CHECK_MESSAGE(e.empty(), e);
}

namespace {

// Rank 0 gives 0 and rank 1 gives x >= 0, so sum and max agree (x): calls that differ only in the
// reduce op then have one right answer, and only a fingerprint round can tell them apart.
void call_sum_and_max_alternately(ProcessGroup& group, int rank, int calls, std::vector<double>& results) {
  for (int i = 0; i < calls; ++i) {
    Tensor t = Tensor::from_vector(std::vector<double>{rank == 0 ? 0.0 : double(i + 1)});
    group.all_reduce(t, (i + rank) % 2 ? ReduceOp::max : ReduceOp::sum)->wait();
    results.push_back(t.item<double>());
  }
}

}  // namespace

TEST_CASE("without DETAIL, no collective pays a fingerprint round: calls that differ only in reduce op all run") {
  constexpr int kCalls = 20;
  auto groups = make_groups(2, options("no-detail", false));
  std::vector<std::vector<double>> results(2);
  auto errors = errors_of(2, [&](int r) {
    call_sum_and_max_alternately(*groups[size_t(r)], r, kCalls, results[size_t(r)]);
  });
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    CHECK_MESSAGE(errors[size_t(r)].empty(), errors[size_t(r)]);
    REQUIRE(results[size_t(r)].size() == size_t(kCalls));
    for (int i = 0; i < kCalls; ++i) CHECK_MESSAGE(results[size_t(r)][size_t(i)] == double(i + 1), "call ", i);
  }
  // Matching calls still agree.
  run_ranks(2, [&](int r) {
    Tensor t = Tensor::from_vector(std::vector<double>{0.5 * (r + 1)});
    groups[size_t(r)]->all_reduce(t, ReduceOp::avg)->wait();
    CHECK(t.item<double>() == 0.75);
  });
}

TEST_CASE("with DETAIL, the same calls that differ only in reduce op fail at the first one") {
  // The check above could not pass by a fingerprint round that misses a differing op.
  auto groups = make_groups(2, options("detail-op", true));
  std::vector<std::vector<double>> results(2);
  auto errors = errors_of(2,
                          [&](int r) { call_sum_and_max_alternately(*groups[size_t(r)], r, 20, results[size_t(r)]); });
  for (int r = 0; r < 2; ++r) {
    CHECK_MESSAGE(errors[size_t(r)].find("collective mismatch") != std::string::npos, errors[size_t(r)]);
    CHECK(results[size_t(r)].empty());
  }
}

TEST_CASE("bad arguments are rejected in the caller's thread with a hint") {
  auto groups = make_groups(1, options("arguments"));
  ProcessGroup& pg = *groups[0];
  Tensor bytes = Tensor::zeros({4}, DType::u8);
  CHECK_THROWS_WITH_AS(pg.all_reduce(bytes), doctest::Contains("take f32, f64, bf16, f16, i32 or i64"), Error);
  CHECK_THROWS_WITH_AS(pg.all_reduce(Tensor()), doctest::Contains("undefined"), Error);
  Tensor in = Tensor::zeros({4}), wrong = Tensor::zeros({5});
  CHECK_THROWS_WITH_AS(pg.all_gather(wrong, in), doctest::Contains("must hold world size (1) x input"), Error);
  CHECK_THROWS_WITH_AS(pg.reduce_scatter(in, wrong), doctest::Contains("must hold world size (1) x output"), Error);
  CHECK_THROWS_WITH_AS(pg.all_reduce_into(wrong, in), doctest::Contains("differ"), Error);
  CHECK_THROWS_WITH_AS(pg.broadcast(in, 3), doctest::Contains("root 3 is not a rank"), Error);
  CHECK_THROWS_WITH_AS(pg.all_reduce_coalesced({in, Tensor::zeros({2}, DType::f64)}),
                       doctest::Contains("mix f32 and f64"), Error);
  // World size 1: every collective is a copy or nothing, and avg divides by one.
  Tensor t = Tensor::from_vector(std::vector<int32_t>{7, -3});
  pg.all_reduce(t, ReduceOp::avg)->wait();
  CHECK(t.to_vector<int32_t>() == std::vector<int32_t>{7, -3});
  pg.barrier()->wait();
}

TEST_CASE("all_reduce_coalesced reduces every tensor") {
  auto groups = make_groups(2, options("coalesced"));
  run_ranks(2, [&](int r) {
    std::vector<Tensor> ts = {Tensor::from_vector(std::vector<float>(3, float(r + 1))),
                              Tensor::from_vector(std::vector<float>(50000, float(2 * r)))};
    groups[size_t(r)]->all_reduce_coalesced(ts)->wait();
    CHECK(ts[0].to_vector<float>() == std::vector<float>(3, 3.f));
    CHECK(ts[1].to_vector<float>() == std::vector<float>(50000, 2.f));
  });
}

TEST_CASE("the backend's old name 'ring' is refused, pointing at 'host' and at the ring algorithm") {
  auto store = std::make_shared<HashStore>();
  CHECK_THROWS_WITH_AS(create_process_group("ring", store, 0, 1),
                       doctest::Contains(
                           "the backend is called 'host' now; 'ring' is one of its algorithms (TINYDDP_ALGO=ring)"),
                       Error);
  // The refusal is about the backend's name only: "ring" as the host backend's algorithm still runs.
  ProcessGroupOptions ring_algorithm;
  ring_algorithm.algorithm = "ring";
  auto group = create_process_group("host", store, 0, 1, ring_algorithm);
  CHECK(group->backend() == "host");
  Tensor t = Tensor::from_vector(std::vector<float>{1.f, 2.f});
  group->all_reduce(t)->wait();
  CHECK(t.to_vector<float>() == std::vector<float>{1.f, 2.f});
}

TEST_CASE("backend selection") {
  auto store = std::make_shared<HashStore>();
  CHECK_THROWS_WITH_AS(create_process_group("mpi", store, 0, 1),
                       doctest::Contains("unknown process group backend 'mpi'"), Error);
  // "host" is the one name of the hand-written backend (it is not Gloo, and does not pose as it).
  CHECK_THROWS_WITH_AS(create_process_group("gloo", store, 0, 1),
                       doctest::Contains("unknown process group backend 'gloo'"), Error);
  CHECK_THROWS_WITH_AS(create_process_group("host", store, 0, 1,
                                            [] {
                                              ProcessGroupOptions o;
                                              o.transport = "udp";
                                              return o;
                                            }()),
                       doctest::Contains("unknown transport 'udp'"), Error);
  auto backends = available_backends();
  CHECK(backends.front() == "host");
#ifndef TINYDDP_WITH_NCCL
  CHECK(backends.size() == 1);
  CHECK_THROWS_WITH_AS(create_process_group("nccl", store, 0, 1), doctest::Contains("not in this build"), Error);
#endif
}

TEST_CASE("each group waits by its own policy: the spin follows its own ranks per core, not the last group made") {
  // Two groups alive in one process, of 2 and of 4 ranks on this host. A group whose ranks outnumber
  // the cores spins longer (yielding); the other keeps the short spin. The policy used to be one
  // process-wide setting, which the last group created overwrote for both.
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  auto pair = make_groups(2, options("policy-pair"));
  auto quad = make_groups(4, options("policy-quad"));
  // Both the spin and the time a wait spins before it starts to yield.
  auto check_policy = [&](const std::vector<std::shared_ptr<ProcessGroup>>& groups) {
    const bool oversubscribed = groups.size() > cores;
    for (const auto& g : groups) {
      const WaitPolicy policy = dynamic_cast<HostBackend&>(*g).wait_policy();
      CHECK(policy.spin ==
            std::chrono::nanoseconds(oversubscribed ? tuning::kSpinBudgetOversubscribed : tuning::kSpinBudget));
      CHECK(policy.pure_spin ==
            std::chrono::nanoseconds(oversubscribed ? tuning::kPureSpinOversubscribed : tuning::kPureSpin));
    }
  };
  check_policy(pair);
  check_policy(quad);
  // Both still work side by side.
  run_ranks(4, [&](int r) {
    Tensor t = Tensor::from_vector(std::vector<int32_t>{r + 1});
    quad[size_t(r)]->all_reduce(t)->wait();
    CHECK(t.item<int32_t>(0) == 10);
    if (r < 2) {
      Tensor u = Tensor::from_vector(std::vector<int32_t>{r + 1});
      pair[size_t(r)]->all_reduce(u)->wait();
      CHECK(u.item<int32_t>(0) == 3);
    }
  });
}

TEST_CASE("the host backend's environment variables: a bad value is refused, naming the variable") {
  auto store = std::make_shared<HashStore>();
  struct Case {
    const char* name;
    const char* value;
  };
  for (Case c :
       {Case{"TINYDDP_SMALL_MESSAGE_BYTES", "32K"}, Case{"TINYDDP_SPIN_US", "-5"}, Case{"TINYDDP_BIND", "yes"}}) {
    CAPTURE(c.name);
    ::setenv(c.name, c.value, 1);
    const std::string expected = std::string(c.name) + "='" + c.value + "'";
    CHECK_THROWS_WITH_AS(create_process_group("host", store, 0, 1, options(std::string("env-") + c.name)),
                         doctest::Contains(expected.c_str()), Error);
    ::unsetenv(c.name);
  }
}

TEST_CASE("CUDA tensors go through pinned host staging on the host backend") {
  if (cuda_device_count() == 0) {
    TINYDDP_SKIP("no CUDA device (", cuda_unavailable_reason(), "); test/gpu covers the staging on a GPU machine");
  }
  auto groups = make_groups(2, options("staging"));
  run_ranks(2, [&](int r) {
    Tensor t = Tensor::from_vector(std::vector<float>(1000, float(r + 1))).to(Device::cuda(0));
    groups[size_t(r)]->all_reduce(t)->wait();
    CHECK(t.to_vector<float>() == std::vector<float>(1000, 3.f));
  });
}
