// What DistributedDataParallel and ZeRO-1 ask of a backend on CUDA devices, checked against the CPU:
// the collectives they call (reduce_scatter, all_gather into its own output, coalesced and `_into`
// all-reduces), the compressing comm hooks, and whole training runs whose weights are compared with
// the same run on CPU ranks over the host backend. One definition, two users: the fake-device tests
// of make test (test/comm/test_nccl_fake.cpp, test/nn/ddp/test_ddp_fake_gpus.cpp: exact, since a fake
// GPU runs the CPU kernels) and the GPU suite (test/gpu/test_gpu_ddp.cpp: within a tolerance, since
// cuBLAS sums its products in another order than the CPU GEMM).
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "tinyddp/comm/process_group.h"
#include "tinyddp/core/cuda_runtime.h"
#include "tinyddp/kernels/ops.h"
#include "tinyddp/nn/ddp/comm_hook.h"
#include "tinyddp/nn/ddp/distributed_data_parallel.h"
#include "tinyddp/nn/optim/adam.h"
#include "tinyddp/nn/optim/sgd.h"
#include "tinyddp/nn/optim/zero_redundancy_optimizer.h"
#include "test/comm/test_collectives_support.h"
#include "test/gpu/gpu_test_support.h"
#include "test/half_precision_reference.h"
#include "test/nn/ddp/test_ddp_support.h"
#include "test/test_support.h"

namespace tinyddp::testing {

// Where the ranks of a check run: a backend and one device per rank (threads act as ranks).
struct RankPlacement {
  std::string backend;          // "nccl", or "host" (CUDA tensors staged through pinned host memory)
  std::vector<Device> devices;  // by rank
  // True where every result must equal the CPU's bit for bit (fake devices run the CPU's kernels);
  // false on a GPU, where the comparison is within a tolerance that says why.
  bool exact = true;

  int world() const { return int(devices.size()); }
};

// One process group per rank of `placement`, created on the ranks' threads (NCCL's init is collective).
inline std::vector<std::shared_ptr<comm::ProcessGroup>> groups_for(const RankPlacement& placement,
                                                                   const std::string& name) {
  auto store = std::make_shared<comm::HashStore>();
  store->set_timeout(std::chrono::seconds(60));
  std::vector<std::shared_ptr<comm::ProcessGroup>> groups(static_cast<size_t>(placement.world()));
  run_ranks(placement.world(), [&](int r) {
    comm::ProcessGroupOptions options;
    options.group_name = name;
    options.timeout = std::chrono::seconds(60);
    options.device = placement.devices[size_t(r)].index;
    cuda_set_device(placement.devices[size_t(r)].index);
    groups[size_t(r)] = comm::create_process_group(placement.backend, store, r, placement.world(), options);
  });
  return groups;
}

// reference_reduce's avg is sum/n; NCCL's float avg premultiplies by 1/n, which is the same bits for
// a world that is a power of two and within a few ulps otherwise (gpu_test_support.h).
inline bool agrees_with_reference(const std::vector<float>& got, comm::ReduceOp op, int world, int64_t count,
                                  int64_t begin = 0) {
  std::vector<float> all = reference_reduce<float>(op, world, count);
  std::vector<float> want(all.begin() + begin, all.begin() + begin + int64_t(got.size()));
  if (op != comm::ReduceOp::avg || (world & (world - 1)) == 0) return got == want;
  std::vector<float> largest(want.size(), 0.f);
  for (int r = 0; r < world; ++r) {
    std::vector<float> in = make_input<float>(op, r, count).to_vector<float>();
    for (size_t i = 0; i < largest.size(); ++i) largest[i] = std::max(largest[i], std::fabs(in[size_t(begin) + i]));
  }
  return close_to_average(got, want, world, largest);
}

// The collectives DDP and ZeRO-1 call, as they call them, on every rank of `placement`; the inputs
// are small integers, so every result is exact and compared with a plain loop over the ranks' inputs.
inline void check_collectives_ddp_and_zero_use(const RankPlacement& placement) {
  const int world = placement.world();
  auto groups = groups_for(placement, "ddp-zero-collectives");
  run_ranks(world, [&](int r) {
    comm::ProcessGroup& g = *groups[size_t(r)];
    const Device device = placement.devices[size_t(r)];
    cuda_set_device(device.index);
    // ZeRO-1's backward: reduce_scatter(avg) of a bucket packed into world equal slots (odd sizes too).
    for (int64_t slot : {int64_t(1), int64_t(257), int64_t(40000)}) {
      Tensor whole = make_input<float>(comm::ReduceOp::avg, r, slot * world).to(device);
      Tensor mine = Tensor::zeros({slot}, DType::f32, device);
      g.reduce_scatter(mine, whole, comm::ReduceOp::avg)->wait();
      CHECK_MESSAGE(agrees_with_reference(mine.to_vector<float>(), comm::ReduceOp::avg, world, slot * world, r * slot),
                    placement.backend << " reduce_scatter avg, slot " << slot << ", rank " << r);
      CHECK_MESSAGE(whole.to_vector<float>() ==
                        make_input<float>(comm::ReduceOp::avg, r, slot * world).to_vector<float>(),
                    placement.backend << " reduce_scatter changed its input, rank " << r);
    }
    {
      Tensor whole = make_input<bfloat16>(comm::ReduceOp::sum, r, 33 * world).to(device);
      Tensor mine = Tensor::zeros({33}, DType::bf16, device);
      g.reduce_scatter(mine, whole, comm::ReduceOp::sum)->wait();
      std::vector<bfloat16> all = reference_reduce<bfloat16>(comm::ReduceOp::sum, world, 33 * world);
      CHECK_MESSAGE(mine.to_vector<bfloat16>() ==
                        std::vector<bfloat16>(all.begin() + 33 * r, all.begin() + 33 * r + 33),
                    placement.backend << " bf16 reduce_scatter, rank " << r);
    }
    // ZeRO-1's step: all_gather whose input is this rank's own slot of the output (in place).
    for (int64_t slot : {int64_t(3), int64_t(1001)}) {
      Tensor staging = Tensor::zeros({slot * world}, DType::f32, device);
      Tensor own = staging.view(r * slot, {slot});
      own.copy_from(make_input<float>(comm::ReduceOp::max, r, slot).to(device));
      g.all_gather(staging, own)->wait();
      std::vector<float> want;
      for (int p = 0; p < world; ++p) {
        std::vector<float> v = make_input<float>(comm::ReduceOp::max, p, slot).to_vector<float>();
        want.insert(want.end(), v.begin(), v.end());
      }
      CHECK_MESSAGE(staging.to_vector<float>() == want,
                    placement.backend << " in-place all_gather, slot " << slot << ", rank " << r);
    }
    // Several buckets in one call (each its own size), and the out-of-place all-reduce.
    std::vector<int64_t> sizes{5, 1000, 7};
    std::vector<Tensor> several;
    for (int64_t n : sizes) several.push_back(make_input<float>(comm::ReduceOp::avg, r, n).to(device));
    g.all_reduce_coalesced(several, comm::ReduceOp::avg)->wait();
    for (size_t i = 0; i < sizes.size(); ++i)
      CHECK_MESSAGE(agrees_with_reference(several[i].to_vector<float>(), comm::ReduceOp::avg, world, sizes[i]),
                    placement.backend << " all_reduce_coalesced tensor " << i << ", rank " << r);
    Tensor input = make_input<float>(comm::ReduceOp::sum, r, 4097).to(device);
    Tensor output = Tensor::zeros({4097}, DType::f32, device);
    g.all_reduce_into(output, input, comm::ReduceOp::sum)->wait();
    CHECK_MESSAGE(output.to_vector<float>() == reference_reduce<float>(comm::ReduceOp::sum, world, 4097),
                  placement.backend << " all_reduce_into, rank " << r);
    CHECK_MESSAGE(input.to_vector<float>() == make_input<float>(comm::ReduceOp::sum, r, 4097).to_vector<float>(),
                  placement.backend << " all_reduce_into changed its input, rank " << r);
    g.barrier()->wait();
  });
}

// ---- training ------------------------------------------------------------------------------------

// Small buckets, so that a 5-7-3 MLP spreads over several of them (and DDP's rebuild moves them).
inline nn::DdpOptions small_buckets() { return {.bucket_cap_mb = 0.0001, .first_bucket_mb = 0.00005}; }

enum class Training { ddp_sgd, zero1_adam };

// A few steps of `how` on every rank of `groups` (rank r on devices[r], its share of one batch);
// returns each rank's final weights.
inline std::vector<std::vector<float>> train_on(const std::vector<std::shared_ptr<comm::ProcessGroup>>& groups,
                                                const std::vector<Device>& devices, Training how) {
  const int world = int(groups.size());
  std::vector<std::vector<float>> weights(static_cast<size_t>(world));
  Tensor x = random_features(8 * world, 5, 1), y = random_labels(8 * world, 3, 2);
  run_ranks(world, [&](int r) {
    const Device device = devices[size_t(r)];
    if (device.is_cuda()) cuda_set_device(device.index);
    auto model = make_mlp({5, 7, 3}, 42);
    model->to(device);
    nn::DistributedDataParallel ddp(*model, groups[size_t(r)], small_buckets());
    std::unique_ptr<nn::Optimizer> plain, zero;
    if (how == Training::ddp_sgd) {
      plain = std::make_unique<nn::SGD>(model->named_parameters(), 0.1);
    } else {
      plain = std::make_unique<nn::Adam>(ddp.named_parameters(), 0.01);
      zero = std::make_unique<nn::ZeroRedundancyOptimizer>(ddp, *plain);
    }
    nn::Optimizer& optimizer = zero ? *zero : *plain;
    std::vector<int64_t> mine;
    for (int64_t i = r; i < 8 * world; i += world) mine.push_back(i);
    for (int step = 0; step < 3; ++step) {
      optimizer.zero_grad();
      train_step_backward(ddp, gather_rows<float>(x, mine).to(device), gather_rows<int64_t>(y, mine).to(device));
      optimizer.step();
    }
    if (zero) static_cast<nn::ZeroRedundancyOptimizer&>(*zero).wait_for_parameters();
    weights[size_t(r)] = flat_values(*model);
  });
  return weights;
}

inline const char* training_name(Training how) { return how == Training::ddp_sgd ? "DDP + SGD" : "ZeRO-1 + Adam"; }

// `how` on `placement` and on as many CPU ranks over the host backend: every replica equal, and the
// weights after 3 steps the CPU's -- to the bit on fake devices (their kernels are the CPU's, and for
// two ranks NCCL's premultiplied average is the ring's sum-then-halve: both exact scalings around one
// rounded addition), within 1e-5 + 1e-4 |w| on a GPU (cuBLAS orders its sums otherwise; three steps
// of a 5-7-3 MLP move weights by about 0.1).
inline void check_training_against_cpu(const RankPlacement& placement, Training how) {
  kernels::set_cpu_threads(1);  // the CPU run and the fake kernels on one GEMM thread: one summation order
  const int world = placement.world();
  std::vector<std::vector<float>> on_cpu = train_on(make_test_groups(world),
                                                    std::vector<Device>(size_t(world), Device::cpu()), how);
  std::vector<std::vector<float>> on_devices;
  {
    auto groups = groups_for(placement, std::string("training-") + (how == Training::ddp_sgd ? "ddp" : "zero1"));
    on_devices = train_on(groups, placement.devices, how);
  }
  const std::string what = std::string(training_name(how)) + " over " + placement.backend;
  for (int r = 1; r < world; ++r)
    check_identical(on_devices[size_t(r)], on_devices[0], what + ": rank " + std::to_string(r) + " vs rank 0");
  CHECK(on_devices[0] != flat_values(*make_mlp({5, 7, 3}, 42)));  // the steps did move the weights
  if (placement.exact)
    check_identical(on_devices[0], on_cpu[0], what + ": weights after 3 steps against the CPU");
  else
    check_close(on_devices[0], on_cpu[0], 1e-5, 1e-4, what + ": weights after 3 steps against the CPU");
}

// The compressing hooks on `placement`: every element of every bucket on every rank equals a closed
// form of the ranks' own gradients -- bf16_compress: the bf16 values summed and rounded, then halved
// (NCCL's premultiplied halves give the same bits), fp16_compress: halved in f32, rounded to f16,
// summed and rounded. On a GPU, NCCL's 16-bit addition may round the sum once where the reference
// rounds it through f32 first: there, within one unit in the last place of the format.
inline void check_compress_hooks(const RankPlacement& placement) {
  REQUIRE(placement.world() == 2);  // the closed forms below are those of two ranks
  struct Hook {
    const char* name;
    nn::CommHook hook;
    Format format;
  };
  for (const Hook& h : {Hook{"bf16_compress", nn::comm_hooks::bf16_compress, kBf16},
                        Hook{"fp16_compress", nn::comm_hooks::fp16_compress, kF16}}) {
    CAPTURE(h.name);
    auto round = [&](double v) { return float(round_to_format(v, h.format)); };
    auto groups = groups_for(placement, std::string("hook-") + h.name);
    Tensor x = random_features(8, 5, 11), y = random_labels(8, 3, 12);
    std::vector<std::vector<std::vector<float>>> before(2), after(2);  // rank, bucket, element
    run_ranks(2, [&](int r) {
      const Device device = placement.devices[size_t(r)];
      cuda_set_device(device.index);
      auto model = make_mlp({5, 7, 3}, 7);
      model->to(device);
      nn::DistributedDataParallel ddp(*model, groups[size_t(r)], small_buckets());
      std::vector<Tensor> buffers;
      ddp.register_comm_hook(nullptr, [&](comm::ProcessGroup& group, nn::GradBucket& bucket) {
        before[size_t(r)].push_back(bucket.buffer.to_vector<float>());
        buffers.push_back(bucket.buffer);
        return h.hook(group, bucket);
      });
      std::vector<int64_t> rows{r * 4, r * 4 + 1, r * 4 + 2, r * 4 + 3};
      model->zero_grad();
      train_step_backward(ddp, gather_rows<float>(x, rows).to(device), gather_rows<int64_t>(y, rows).to(device));
      for (const Tensor& b : buffers) after[size_t(r)].push_back(b.to_vector<float>());
    });
    REQUIRE(before[0].size() > 1);  // several buckets
    size_t wrong = 0;
    for (size_t b = 0; b < before[0].size(); ++b)
      for (size_t i = 0; i < before[0][b].size(); ++i) {
        const float g0 = before[0][b][i], g1 = before[1][b][i];
        const float want = std::string(h.name) == "bf16_compress"
                               ? round(double(round(double(round(g0)) + double(round(g1)))) / 2)
                               : round(double(round(double(g0 * 0.5f))) + double(round(double(g1 * 0.5f))));
        const double ulp = want == 0 ? 0 : std::ldexp(1.0, std::ilogb(want) - (h.format.precision - 1));
        for (int r = 0; r < 2; ++r) {
          const float got = after[size_t(r)][b][i];
          const bool ok = placement.exact ? got == want : std::fabs(double(got) - double(want)) <= ulp;
          if (!ok && wrong++ < 5)
            FAIL_CHECK(placement.backend << " " << h.name << ": bucket " << b << " element " << i << " rank " << r
                                         << ": " << got << ", expected " << want);
        }
      }
    CHECK(wrong == 0);
  }
}

}  // namespace tinyddp::testing
