// The nccl backend's own logic, run on fake CUDA devices through fake NCCL (test/support/fake_cuda.h,
// test/support/fake_nccl.h): results, NCCL's float average, teardown by NCCL's protocol, a failed
// enqueue, the one-thread-per-communicator rule, and the device rules (tensors on the group's
// device, one GPU per rank). Ranks are threads here, each on its own fake device.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "tinyddp/comm/process_group.h"
#include "tinyddp/core/cuda_runtime.h"
#include "tinyddp/kernels/ops.h"
#include "test/comm/test_collectives_support.h"
#include "test/gpu/ddp_on_devices.h"
#include "test/gpu/gpu_test_support.h"
#include "test/support/fake_cuda.h"
#include "test/support/fake_nccl.h"
#include "test/test_support.h"

using namespace tinyddp;
using namespace tinyddp::comm;
using namespace tinyddp::testing;

namespace {

// `world` nccl groups over one store, rank r on fake cuda:r, created on the ranks' threads.
std::vector<std::shared_ptr<ProcessGroup>> nccl_groups(int world, const std::string& name) {
  auto store = std::make_shared<HashStore>();
  store->set_timeout(std::chrono::seconds(30));
  std::vector<std::shared_ptr<ProcessGroup>> groups(static_cast<size_t>(world));
  run_ranks(world, [&](int r) {
    ProcessGroupOptions options;
    options.group_name = name;
    options.timeout = std::chrono::seconds(30);
    options.device = r;
    groups[size_t(r)] = create_process_group("nccl", store, r, world, options);
  });
  return groups;
}

FakeCudaOptions ranks_as_threads(int devices) { return {.devices = devices, .one_device_per_process = false}; }

}  // namespace

TEST_CASE("nccl backend on fake devices: every collective agrees with the reference") {
  FakeCudaDevices devices(ranks_as_threads(2));
  {
    auto groups = nccl_groups(2, "results");
    CHECK(groups[0]->backend() == "nccl");
    run_ranks(2, [&](int r) {
      ProcessGroup& g = *groups[size_t(r)];
      const Device device = Device::cuda(r);
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min, ReduceOp::prod}) {
        Tensor t = make_input<float>(op, r, 1001).to(device);
        g.all_reduce(t, op)->wait();
        CHECK(t.to_vector<float>() == reference_reduce<float>(op, 2, 1001));
      }
      Tensor ints = make_input<int64_t>(ReduceOp::sum, r, 33).to(device);
      g.all_reduce(ints, ReduceOp::avg)->wait();
      CHECK(ints.to_vector<int64_t>() == reference_reduce<int64_t>(ReduceOp::avg, 2, 33));
      Tensor in = make_input<double>(ReduceOp::max, r, 17).to(device);
      Tensor gathered = Tensor::zeros({34}, DType::f64, device);
      g.all_gather(gathered, in)->wait();
      std::vector<double> want = make_input<double>(ReduceOp::max, 0, 17).to_vector<double>();
      std::vector<double> second = make_input<double>(ReduceOp::max, 1, 17).to_vector<double>();
      want.insert(want.end(), second.begin(), second.end());
      CHECK(gathered.to_vector<double>() == want);
      Tensor b = make_input<int32_t>(ReduceOp::max, r, 9).to(device);
      g.broadcast(b, 1)->wait();
      CHECK(b.to_vector<int32_t>() == make_input<int32_t>(ReduceOp::max, 1, 9).to_vector<int32_t>());
      Tensor whole = make_input<float>(ReduceOp::sum, r, 20).to(device), half = Tensor::zeros({10}, DType::f32, device);
      g.reduce_scatter(half, whole, ReduceOp::sum)->wait();
      std::vector<float> all = reference_reduce<float>(ReduceOp::sum, 2, 20);
      CHECK(half.to_vector<float>() == std::vector<float>(all.begin() + 10 * r, all.begin() + 10 * r + 10));
      std::vector<Tensor> several{make_input<float>(ReduceOp::sum, r, 5).to(device),
                                  make_input<float>(ReduceOp::sum, r, 7).to(device)};
      g.all_reduce_coalesced(several)->wait();
      CHECK(several[1].to_vector<float>() == reference_reduce<float>(ReduceOp::sum, 2, 7));
      // 16-bit floats (ncclBfloat16, ncclFloat16): avg is the premultiplied sum, exact for these values.
      Tensor halves = make_input<bfloat16>(ReduceOp::sum, r, 101).to(device);
      g.all_reduce(halves, ReduceOp::avg)->wait();
      CHECK(halves.to_vector<bfloat16>() == reference_reduce<bfloat16>(ReduceOp::avg, 2, 101));
      Tensor whole16 = make_input<float16>(ReduceOp::sum, r, 22).to(device),
             half16 = Tensor::zeros({11}, DType::f16, device);
      g.reduce_scatter(half16, whole16, ReduceOp::sum)->wait();
      std::vector<float16> all16 = reference_reduce<float16>(ReduceOp::sum, 2, 22);
      CHECK(half16.to_vector<float16>() == std::vector<float16>(all16.begin() + 11 * r, all16.begin() + 11 * r + 11));
      g.barrier()->wait();
    });
  }
  CHECK(fake_nccl().live_communicators() == 0);
}

TEST_CASE("nccl backend on fake devices: the collectives DDP and ZeRO-1 use agree with the reference") {
  // reduce_scatter (avg, odd slots, bf16), all_gather into its own output, coalesced and _into
  // all-reduces: test/gpu/ddp_on_devices.h, which the GPU suite runs on real devices too.
  FakeCudaDevices devices(ranks_as_threads(2));
  check_collectives_ddp_and_zero_use({.backend = "nccl", .devices = {Device::cuda(0), Device::cuda(1)}});
  CHECK(fake_nccl().live_communicators() == 0);
}

TEST_CASE(
    "nccl backend on asynchronous fake devices: a collective starts only after the kernels that wrote its input") {
  // The fill is still queued on the default stream (its output poisoned) when the collective is
  // launched on the communication stream: only the backend's cudaStreamWaitEvent orders the two.
  FakeCudaOptions options = ranks_as_threads(2);
  options.launch_delay = std::chrono::milliseconds(20);
  FakeCudaDevices devices(options);
  {
    auto groups = nccl_groups(2, "ordered");
    run_ranks(2, [&](int r) {
      cuda_set_device(r);
      for (int round = 0; round < 3; ++round) {
        Tensor t = Tensor::zeros({256}, DType::f32, Device::cuda(r));
        kernels::fill(t, float(r + 1 + round));
        groups[size_t(r)]->all_reduce(t, ReduceOp::sum)->wait();
        CHECK(t.to_vector<float>() == std::vector<float>(256, float(3 + 2 * round)));
      }
    });
  }
  CHECK(fake_nccl().live_communicators() == 0);
}

TEST_CASE("nccl backend: wait() orders the caller's stream after the collective and leaves the host free") {
  // Each piece of device work runs 100 ms after it is queued. wait() returns while the all-reduce is
  // still queued; the scale launched next, and the host read after it, still see the reduced values
  // (a scale that overtook the collective would read poison, or be overwritten by the sum).
  FakeCudaOptions options = ranks_as_threads(2);
  options.launch_delay = std::chrono::milliseconds(100);
  FakeCudaDevices devices(options);
  {
    auto groups = nccl_groups(2, "stream-ordered");
    std::vector<int> returned_before_done(2, -1), barrier_blocked(2, -1);
    run_ranks(2, [&](int r) {
      cuda_set_device(r);
      Tensor t = Tensor::zeros({64}, DType::f32, Device::cuda(r));
      kernels::fill(t, float(r + 1));
      WorkPtr work = groups[size_t(r)]->all_reduce(t, ReduceOp::sum);
      work->wait();
      returned_before_done[size_t(r)] = !work->is_completed();
      kernels::scale(t, 2.f);
      CHECK(t.to_vector<float>() == std::vector<float>(64, 6.f));
      work->synchronize();  // the host learns it is done
      CHECK(work->is_completed());
      // A barrier blocks the host: it is what a barrier is for.
      WorkPtr barrier = groups[size_t(r)]->barrier();
      barrier->wait();
      barrier_blocked[size_t(r)] = barrier->is_completed();
    });
    CHECK(returned_before_done == std::vector<int>{1, 1});
    CHECK(barrier_blocked == std::vector<int>{1, 1});
  }
  CHECK(fake_nccl().live_communicators() == 0);
}

TEST_CASE("nccl backend on fake devices: a float avg over 3 ranks is NCCL's premultiplied sum, close to sum/n") {
  FakeCudaDevices devices(ranks_as_threads(3));
  {
    auto groups = nccl_groups(3, "average");
    run_ranks(3, [&](int r) {
      Tensor t = make_input<float>(ReduceOp::avg, r, 999).to(Device::cuda(r));
      groups[size_t(r)]->all_reduce(t, ReduceOp::avg)->wait();
      std::vector<float> largest(999, 0.f);
      for (int p = 0; p < 3; ++p) {
        std::vector<float> in = make_input<float>(ReduceOp::avg, p, 999).to_vector<float>();
        for (size_t i = 0; i < in.size(); ++i) largest[i] = std::max(largest[i], std::fabs(in[i]));
      }
      CHECK(close_to_average(t.to_vector<float>(), reference_reduce<float>(ReduceOp::avg, 3, 999), 3, largest));
    });
  }
}

TEST_CASE("nccl backend teardown: finalize, wait until quiescent, destroy -- nothing leaked, no group left open") {
  FakeCudaDevices devices(ranks_as_threads(2));
  const size_t before = fake_nccl().live_communicators();
  {
    auto groups = nccl_groups(2, "teardown");
    run_ranks(2, [&](int r) {
      Tensor t = Tensor::zeros({8}, DType::f32, Device::cuda(r));
      groups[size_t(r)]->all_reduce(t)->wait();
    });
    CHECK(fake_nccl().live_communicators() == before + 2);
    run_ranks(2, [&](int r) {
      groups[size_t(r)].reset();
      // ncclCommDestroy on a communicator still in progress returns early, inside a group.
      CHECK(fake_nccl().thread_group_depth() == 0);
    });
  }
  CHECK(fake_nccl().live_communicators() == before);
}

TEST_CASE("nccl backend: a collective NCCL refuses ends its group, aborts the communicator and says why") {
  FakeCudaDevices devices(ranks_as_threads(1));
  {
    auto groups = nccl_groups(1, "refused");
    Tensor t = Tensor::zeros({4}, DType::f32, Device::cuda(0));
    fake_nccl().fail_next_collective(NcclResult::invalid_usage, "injected failure");
    CHECK_THROWS_WITH_AS(groups[0]->all_reduce(t)->wait(), doctest::Contains("injected failure"), Error);
    CHECK(fake_nccl().thread_group_depth() == 0);  // the group was ended although the enqueue failed
    CHECK(fake_nccl().live_communicators() == 0);  // aborted
    CHECK_THROWS_WITH_AS(groups[0]->all_reduce(t), doctest::Contains("aborted by an earlier failure"), Error);
  }
}

TEST_CASE("nccl backend: the flight recorder keeps its collectives; a failure and SIGUSR1 write the record") {
  FakeCudaDevices devices(ranks_as_threads(2));
  TempDir dir;
  setenv("TINYDDP_FLIGHT_RECORDER", dir.path.string().c_str(), 1);
  {
    auto groups = nccl_groups(1, "recorded");
    Tensor t = Tensor::zeros({4}, DType::f32, Device::cuda(0));
    // synchronize(): the record is the host's, and wait() would only order the device's stream.
    groups[0]->all_reduce(t)->synchronize();
    groups[0]->all_reduce(t, ReduceOp::sum, {.bucket = 3})->synchronize();
    CHECK(groups[0]->time_in_collectives().collectives == 2);
    fake_nccl().fail_next_collective(NcclResult::invalid_usage, "injected failure");
    const std::string written = "(flight record: " + dir.path.string() + "/rank-0.recorded.json)";
    CHECK_THROWS_WITH_AS(groups[0]->all_reduce(t)->wait(), doctest::Contains(written.c_str()), Error);
    std::ifstream in(dir.path / "rank-0.recorded.json");
    auto record = nlohmann::json::parse(in);
    CHECK(record["reason"] == "error");
    CHECK(record["last_finished"] == 1);
    CHECK(record["entries"][1]["bucket"] == 3);
    CHECK(record["entries"][2]["state"] == "failed");
    CHECK(std::string(record["error"]).find("injected failure") != std::string::npos);
  }
  {
    // SIGUSR1 (what tinyddp-run sends a stuck job): the watchdog thread writes the record.
    auto groups = nccl_groups(1, "signalled");
    Tensor t = Tensor::zeros({4}, DType::f32, Device::cuda(0));
    groups[0]->all_reduce(t)->synchronize();  // wait() would only order the stream: the record needs it done
    raise(SIGUSR1);
    const auto path = dir.path / "rank-0.signalled.json";
    for (int i = 0; i < 2000 && !std::filesystem::exists(path); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    REQUIRE(std::filesystem::exists(path));
    std::ifstream in(path);
    auto record = nlohmann::json::parse(in);
    CHECK(record["reason"] == "SIGUSR1");
    CHECK(record["last_finished"] == 0);
  }
  unsetenv("TINYDDP_FLIGHT_RECORDER");
}

TEST_CASE("nccl backend: one thread at a time per communicator, with the watchdog polling throughout") {
  FakeCudaDevices devices(ranks_as_threads(2));
  const size_t before = fake_nccl().violations().size();
  {
    auto groups = nccl_groups(2, "threads");
    run_ranks(2, [&](int r) {
      Tensor t = Tensor::zeros({64}, DType::f32, Device::cuda(r));
      std::vector<WorkPtr> works;
      for (int i = 0; i < 200; ++i) {
        works.push_back(groups[size_t(r)]->all_reduce(t));
        if (i % 3 == 0) works.back()->wait();  // a waiter polls too (Work's helper)
      }
      for (auto& w : works) w->wait();
    });
  }
  CHECK(fake_nccl().violations().size() == before);
}

TEST_CASE("fake NCCL records a second thread calling in while another is inside the communicator") {
  FakeCudaDevices devices(ranks_as_threads(2));
  FakeNccl& nccl = fake_nccl();
  NcclUniqueId id;
  REQUIRE(nccl.get_unique_id(&id) == NcclResult::success);
  std::vector<NcclComm> comms(2, nullptr);
  std::vector<Tensor> buffers(2);
  run_ranks(2, [&](int r) {
    cuda_set_device(r);
    buffers[size_t(r)] = Tensor::zeros({4}, DType::f32, Device::cuda(r));
    NcclResult state = nccl.comm_init_rank(&comms[size_t(r)], 2, id, r, false);
    while (state == NcclResult::in_progress) nccl.comm_get_async_error(comms[size_t(r)], &state);
    REQUIRE(state == NcclResult::success);
  });
  const size_t before = nccl.violations().size();
  // A collective call returns at once (the data moves later, on the stream): hold rank 0's inside.
  nccl.hold_collective_calls(std::chrono::milliseconds(300));
  std::atomic<bool> polled{false}, rank0_calling{false};
  run_ranks(2, [&](int r) {
    cuda_set_device(r);
    void* data = buffers[size_t(r)].raw_data();
    if (r == 0) rank0_calling = true;
    if (r == 1) {
      // Rank 0 enters its all-reduce and stays there: poll its communicator from here until the poll
      // collides with it (refused, and recorded once).
      while (!rank0_calling) std::this_thread::yield();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // past rank 0's enqueue, into its wait
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      NcclResult state;
      while (nccl.comm_get_async_error(comms[0], &state) == NcclResult::success &&
             std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      polled = nccl.violations().size() == before + 1;
    }
    nccl.all_reduce(data, data, 4, DType::f32, ReduceOp::sum, comms[size_t(r)], nullptr);
  });
  nccl.hold_collective_calls(std::chrono::milliseconds(0));
  CHECK(polled);
  REQUIRE(nccl.violations().size() == before + 1);
  CHECK(nccl.violations().back().find("ncclCommGetAsyncError") != std::string::npos);
  for (NcclComm c : comms) nccl.comm_abort(c);
  buffers.clear();
}

TEST_CASE("nccl backend: tensors must be on the group's device, and two ranks cannot share one GPU") {
  FakeCudaDevices devices(ranks_as_threads(2));
  {
    auto groups = nccl_groups(2, "devices");
    Tensor cpu = Tensor::zeros({4});
    CHECK_THROWS_WITH_AS(groups[1]->all_reduce(cpu),
                         doctest::Contains("f32[4] on cpu is not on this rank's device cuda:1"), Error);
    Tensor other = Tensor::zeros({4}, DType::f32, Device::cuda(0));
    CHECK_THROWS_WITH_AS(groups[1]->broadcast(other),
                         doctest::Contains("on cuda:0 is not on this rank's device cuda:1"), Error);
  }
  auto store = std::make_shared<HashStore>();
  std::vector<std::string> errors(2);
  run_ranks(2, [&](int r) {
    ProcessGroupOptions options;
    options.group_name = "shared-gpu";
    options.timeout = std::chrono::seconds(30);
    options.device = 0;
    try {
      create_process_group("nccl", store, r, 2, options);
    } catch (const Error& e) {
      errors[size_t(r)] = e.message();
    }
  });
  for (const std::string& e : errors)
    CHECK(e.find("Duplicate GPU detected : rank 0 and rank 1 both on CUDA device 0") != std::string::npos);
}

TEST_CASE("nccl backend: a second rank on a host with one GPU is refused by tinyddp, before NCCL") {
  // tinyddp-run -n 2 on a one-GPU host: each process sees cuda:0, LOCAL_RANK is 1 for the second.
  FakeCudaDevices devices(ranks_as_threads(1));
  ScopedEnv visible("CUDA_VISIBLE_DEVICES", nullptr);
  ScopedEnv local_rank("LOCAL_RANK", "1");
  auto store = std::make_shared<HashStore>();
  ProcessGroupOptions options;
  options.group_name = "one-gpu";
  CHECK_THROWS_WITH_AS(create_process_group("nccl", store, 1, 2, options),
                       doctest::Contains("rank 1 has no CUDA device of its own: this process sees 1"), Error);
  CHECK(fake_nccl().live_communicators() == 0);  // refused before any NCCL call
}

TEST_CASE("nccl_load_problem: an NCCL half that will not load is said, with the path and the loader's reason") {
  TempDir dir;
  const std::string bogus = dir.file("libtinyddp_nccl.so");
  std::ofstream(bogus) << "not a library";
  const std::string problem = nccl_load_problem(bogus);
  CHECK(problem.find(bogus) != std::string::npos);
  CHECK(problem.find("does not load") != std::string::npos);
  CHECK(problem.find("nvidia/nccl/lib") != std::string::npos);
  CHECK(nccl_load_problem(dir.file("missing.so")).find("does not load") != std::string::npos);
  // On fake devices with the fake NCCL linked, the backend is available and nothing is said.
  FakeCudaDevices devices(ranks_as_threads(1));
  CHECK(nccl_available());
  CHECK(nccl_unavailable_reason().empty());
  CHECK(backend_unavailable_reason("nccl").empty());
  CHECK(backend_unavailable_reason("gloo").find("no backend") != std::string::npos);
}
