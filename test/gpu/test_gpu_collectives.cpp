// Collectives on CUDA tensors: the nccl backend (one rank per device, threads as ranks), and the
// host backend's staging through pinned host memory. Each result is checked against the same
// reference loop the CPU tests use. Skips with a message where there is no GPU.
#include <doctest/doctest.h>

#include "tinyddp/comm/process_group.h"
#include "tinyddp/core/cuda_runtime.h"
#include "test/comm/test_collectives_support.h"
#include "test/gpu/gpu_test_support.h"
#include "test/test_skip.h"

using namespace tinyddp;
using namespace tinyddp::comm;
using namespace tinyddp::testing;

namespace {

bool have_gpu() { return gpu_available(); }

// NCCL's float avg is not sum/n to the bit (gpu_test_support.h); every other op is exact here.
bool agrees(const std::vector<float>& got, ReduceOp op, int world, int64_t count) {
  std::vector<float> want = reference_reduce<float>(op, world, count);
  if (op != ReduceOp::avg) return got == want;
  std::vector<float> largest(want.size(), 0.f);
  for (int r = 0; r < world; ++r) {
    std::vector<float> in = make_input<float>(op, r, count).to_vector<float>();
    for (size_t i = 0; i < in.size(); ++i) largest[i] = std::max(largest[i], std::fabs(in[i]));
  }
  return close_to_average(got, want, world, largest);
}

void check_all_reduce_on_devices(const std::string& backend, int world, bool one_device) {
  auto store = std::make_shared<HashStore>();
  ProcessGroupOptions options;
  options.timeout = std::chrono::seconds(60);
  options.group_name = backend + "-gpu";
  std::vector<std::shared_ptr<ProcessGroup>> groups(static_cast<size_t>(world));
  run_ranks(world, [&](int r) {
    ProcessGroupOptions mine = options;
    mine.device = one_device ? 0 : r;
    groups[size_t(r)] = create_process_group(backend, store, r, world, mine);
  });
  std::vector<std::string> failures(static_cast<size_t>(world));
  run_ranks(world, [&](int r) {
    Device device = Device::cuda(one_device ? 0 : r);
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min, ReduceOp::prod}) {
      for (int64_t count : {int64_t(1), int64_t(1001), int64_t(1) << 20}) {
        Tensor t = make_input<float>(op, r, count).to(device);
        groups[size_t(r)]->all_reduce(t, op)->wait();
        if (!agrees(t.to_vector<float>(), op, world, count))
          failures[size_t(r)] = backend + " all_reduce " + reduce_op_name(op) + " x" + std::to_string(count) +
                                " differs";
      }
    }
    Tensor in = make_input<double>(ReduceOp::max, r, 33).to(device);
    Tensor out = Tensor::zeros({33 * world}, DType::f64, device);
    groups[size_t(r)]->all_gather(out, in)->wait();
    std::vector<double> want;
    for (int p = 0; p < world; ++p) {
      auto v = make_input<double>(ReduceOp::max, p, 33).to_vector<double>();
      want.insert(want.end(), v.begin(), v.end());
    }
    if (out.to_vector<double>() != want) failures[size_t(r)] = backend + " all_gather differs";
    Tensor b = make_input<int64_t>(ReduceOp::max, r, 17).to(device);
    groups[size_t(r)]->broadcast(b, world - 1)->wait();
    if (b.to_vector<int64_t>() != make_input<int64_t>(ReduceOp::max, world - 1, 17).to_vector<int64_t>())
      failures[size_t(r)] = backend + " broadcast differs";
    // bf16 (ncclBfloat16 on the nccl backend): sums of these small integers are exact in 16 bits.
    Tensor h = make_input<bfloat16>(ReduceOp::sum, r, 4099).to(device);
    groups[size_t(r)]->all_reduce(h, ReduceOp::sum)->wait();
    if (h.to_vector<bfloat16>() != reference_reduce<bfloat16>(ReduceOp::sum, world, 4099))
      failures[size_t(r)] = backend + " bf16 all_reduce differs";
    groups[size_t(r)]->barrier()->wait();
  });
  for (auto& f : failures) CHECK_MESSAGE(f.empty(), f);
}

}  // namespace

TEST_CASE("host backend: CUDA tensors staged through pinned host memory agree with the reference") {
  if (!have_gpu()) return;
  check_all_reduce_on_devices("host", 2, /*one_device=*/true);
}

TEST_CASE("nccl backend: one rank per device agrees with the reference") {
  if (!have_gpu()) return;
  auto backends = available_backends();
  if (std::find(backends.begin(), backends.end(), "nccl") == backends.end()) {
    TINYDDP_SKIP("this build has no NCCL");
  }
  check_all_reduce_on_devices("nccl", cuda_device_count(), /*one_device=*/false);
  // On one GPU that was a world of 1 (NCCL loads, launches and copies); say what it could not check.
  if (const std::string why = nccl_ranks_unavailable_reason(); !why.empty()) TINYDDP_SKIP_PART(why);
}
