// A NaN or infinite loss: the Trainer stops at once naming where (the default), or skips the step
// (NonFiniteLoss::skip_step) and ends exactly where training without that batch ends.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

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
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), 1e30f}) {
    CAPTURE(bad);
    Setup skipping, reference;
    nn::DataLoader poisoned_loader(poisoned(bad), {.batch_size = kBatch});
    nn::DataLoader reference_loader(without_batch_3(), {.batch_size = kBatch});
    MlpTrainer trainer(*skipping.model, Device::cpu(), *skipping.optimizer, skipping.scheduler.get(),
                       {.log_bar = false, .non_finite_loss = nn::NonFiniteLoss::skip_step});
    MlpTrainer plain(*reference.model, Device::cpu(), *reference.optimizer, reference.scheduler.get(), {.log_bar = false});
    trainer.run(2, poisoned_loader);
    plain.run(2, reference_loader);
    CHECK(trainer.skipped_steps() == 2);  // batch 3 of each epoch
    CHECK(trainer.global_step() == plain.global_step());
    CHECK(flat_weights(*skipping.model) == flat_weights(*reference.model));
    CHECK(trainer.history().back().train.at("loss") == plain.history().back().train.at("loss"));
  }
}
