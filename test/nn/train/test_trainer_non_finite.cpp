// A NaN or infinite loss: the Trainer stops at once naming where (the default), or skips the step
// (NonFiniteLoss::skip_step) and ends exactly where training without that batch ends.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#include "tinyddp/nn/train/addons/multi_device.h"
#include "test/nn/ddp/test_ddp_support.h"
#include "test/nn/train/test_trainer_support.h"

using namespace tinyddp;
using namespace tinyddp::testing;

namespace {

constexpr int64_t kSamples = 96, kBatch = 16;  // 6 batches
constexpr int64_t kPoisonedRow = 40;           // in batch 3 (rows 32..47)

// The three-class data with one feature of kPoisonedRow set to `value`.
std::shared_ptr<nn::TensorDataset> poisoned(float value) {
  auto data = three_class_data(kSamples, 11);
  Tensor x = data->features().clone();
  x.data<float>()[kPoisonedRow * 6] = value;
  return std::make_shared<nn::TensorDataset>(x, data->targets().clone());
}

// The same data without batch 3's rows: what a skipped step should leave the model as.
std::shared_ptr<nn::TensorDataset> without_batch_3() {
  auto data = three_class_data(kSamples, 11);
  std::vector<float> x = data->features().to_vector<float>(), kept_x;
  std::vector<int64_t> y = data->targets().to_vector<int64_t>(), kept_y;
  for (int64_t row = 0; row < kSamples; ++row) {
    if (row >= 2 * kBatch && row < 3 * kBatch) continue;
    kept_x.insert(kept_x.end(), x.begin() + row * 6, x.begin() + (row + 1) * 6);
    kept_y.push_back(y[size_t(row)]);
  }
  const int64_t n = int64_t(kept_y.size());
  return std::make_shared<nn::TensorDataset>(Tensor::from_vector(kept_x, {n, 6}), Tensor::from_vector(kept_y, {n}));
}

bool all_finite(const std::vector<float>& values) {
  for (float v : values)
    if (!std::isfinite(v)) return false;
  return true;
}

}  // namespace

TEST_CASE("Trainer: a NaN loss stops the run naming the epoch, the batch and the step, before the weights take it") {
  Setup s;
  nn::DataLoader loader(poisoned(std::numeric_limits<float>::quiet_NaN()), {.batch_size = kBatch});
  MlpTrainer trainer(*s.model, Device::cpu(), *s.optimizer, s.scheduler.get(), {.log_bar = false});
  CHECK_THROWS_WITH_AS(trainer.run(2, loader),
                       doctest::Contains("the loss is nan at epoch 1, batch 3 (step 3, rank 0); stopped before the "
                                         "optimizer step"),
                       Error);
  CHECK(trainer.global_step() == 2);
  CHECK(all_finite(flat_weights(*s.model)));
}

TEST_CASE("Trainer: skip_step skips a non-finite step and ends where training without that batch ends") {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    CAPTURE(bad);
    Setup skipping, reference;
    nn::DataLoader poisoned_loader(poisoned(bad), {.batch_size = kBatch});
    nn::DataLoader reference_loader(without_batch_3(), {.batch_size = kBatch});
    MlpTrainer trainer(*skipping.model, Device::cpu(), *skipping.optimizer, skipping.scheduler.get(),
                       {.log_bar = false, .non_finite_loss = nn::NonFiniteLoss::skip_step});
    MlpTrainer plain(*reference.model, Device::cpu(), *reference.optimizer, reference.scheduler.get(),
                     {.log_bar = false});
    trainer.run(2, poisoned_loader);
    plain.run(2, reference_loader);
    CHECK(trainer.skipped_steps() == 2);  // batch 3 of each epoch
    CHECK(trainer.global_step() == plain.global_step());
    CHECK(flat_weights(*skipping.model) == flat_weights(*reference.model));
    CHECK(trainer.history().back().train.at("loss") == plain.history().back().train.at("loss"));
  }
}

// ---- under DDP: every rank skips together -----------------------------------------------------------

namespace {

using Spawning = nn::WithAddOns<MlpTrainer, nn::MultiDevice>;
constexpr const char* kCase =
    "Trainer: skip_step under MultiDevice skips on every rank when only one rank's loss is NaN";
constexpr int64_t kDdpSamples = 100, kDdpBatch = 10;  // 50 rows per rank: 5 steps of 10
constexpr int64_t kRankOneRow = 41;                   // rank 1's step 3 (rank r reads rows r, r + 2, ...)

}  // namespace

TEST_CASE(kCase) {
  const bool worker = nn::detect_process_role(2) == nn::ProcessRole::spawned_worker;
  Setup s(5, 1e-2);
  auto data = three_class_data(kDdpSamples, 13);
  Tensor x = data->features().clone();
  x.data<float>()[kRankOneRow * 6 + 2] = std::numeric_limits<float>::quiet_NaN();
  nn::DataLoader loader(std::make_shared<nn::TensorDataset>(x, data->targets().clone()), {.batch_size = kDdpBatch});
  Spawning trainer(*s.model, std::vector<Device>(2, Device::cpu()), *s.optimizer, nullptr,
                   {.log_bar = false, .non_finite_loss = nn::NonFiniteLoss::skip_step});
  trainer.multi_device_options().worker_command = {nn::this_program_command()[0], std::string("--test-case=") + kCase,
                                                   "--no-intro=true"};
  trainer.multi_device_options().timeout = std::chrono::seconds(120);
  trainer.run(1, loader);
  if (worker) {
    CHECK(trainer.skipped_steps() == 1);  // rank 0's loss was finite: it skipped because the average was not
    return;
  }
  CHECK(trainer.global_step() == 4);
  // One process computing what the two ranks computed, step 3 left out: each step's two halves (rank r
  // reads rows r, r + 2, ...) forward and backward separately, their gradients averaged as the
  // all-reduce averages, then Adam. The workers' GEMMs ran on their share of the cores (MultiDevice
  // gives each of the 2 local ranks cores / 2 threads); the reference runs on as many, so every product
  // is split as the ranks split it and the weights agree to the bit. (One 20-row batch per step would
  // add the rows' contributions in another order and agree to rounding only, which Adam's
  // normalisation can magnify without bound for a gradient near zero.)
  kernels::set_cpu_threads(std::max(1, int(std::max(1u, std::thread::hardware_concurrency())) / 2));
  Setup reference(5, 1e-2);
  for (int64_t step = 0; step < 5; ++step) {
    if (step == 2) continue;
    std::vector<float> averaged = gradients_as_ddp_averages(*reference.model, 2, [&](int rank) {
      std::vector<int64_t> rows;
      for (int64_t j = 0; j < kDdpBatch; ++j) rows.push_back(rank + 2 * (step * kDdpBatch + j));
      train_step_backward(*reference.model, gather_rows<float>(x, rows), gather_rows<int64_t>(data->targets(), rows));
    });
    reference.optimizer->zero_grad();
    set_flat_grads(*reference.model, averaged);
    reference.optimizer->step();
  }
  const std::vector<float> got = flat_weights(*s.model), want = flat_weights(*reference.model);
  CHECK(all_finite(got));
  check_identical(got, want, "DDP with step 3 skipped vs one process without it");
}
