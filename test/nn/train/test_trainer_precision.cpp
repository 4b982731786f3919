// The Trainer under a mixed precision (TrainerOptions::precision): bf16 trains with F32 master
// weights in its checkpoints; fp16 scales the loss, skips the steps whose gradients overflowed and
// backs off, keeps its scaler's state in checkpoints, and under DDP skips on every rank when only one
// rank overflowed.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include "tinyddp/core/safetensors.h"
#include "tinyddp/nn/train/addons/multi_device.h"
#include "tinyddp/nn/train/checkpoint.h"
#include "test/nn/train/test_trainer_support.h"

using namespace tinyddp;
using namespace tinyddp::testing;

namespace {

constexpr int64_t kSamples = 96, kBatch = 16;  // 6 batches an epoch

bool all_finite(const std::vector<float>& values) {
  return std::all_of(values.begin(), values.end(), [](float v) { return std::isfinite(v); });
}

}  // namespace

TEST_CASE("Trainer: fp16 without a loss scaler is refused; the scaler exists under fp16 only") {
  Setup s;
  CHECK_THROWS_WITH_AS(MlpTrainer(*s.model, Device::cpu(), *s.optimizer, s.scheduler.get(),
                                  {.precision = nn::Precision::fp16, .loss_scaler = {.enabled = false}}),
                       doctest::Contains("precision fp16 with loss_scaler.enabled = false"), Error);
  CHECK_THROWS_WITH_AS(MlpTrainer(*s.model, Device::cpu(), *s.optimizer, s.scheduler.get(),
                                  {.precision = nn::Precision::fp16, .loss_scaler = {.growth_interval = 0}}),
                       doctest::Contains("growth_interval is 0"), Error);
  MlpTrainer bf16(*s.model, Device::cpu(), *s.optimizer, s.scheduler.get(), {.precision = nn::Precision::bf16});
  CHECK(bf16.loss_scaler() == nullptr);
  MlpTrainer fp16(*s.model, Device::cpu(), *s.optimizer, s.scheduler.get(), {.precision = nn::Precision::fp16});
  REQUIRE(fp16.loss_scaler() != nullptr);
  CHECK(fp16.loss_scaler()->scale() == 65536);
}

TEST_CASE("Trainer: bf16 learns as fp32 does, computes otherwise, and its checkpoint holds F32 weights and state") {
  auto data = three_class_data(kSamples, 3);
  Setup fp32_setup, bf16_setup;
  nn::DataLoader loader(data, {.batch_size = kBatch});
  MlpTrainer fp32(*fp32_setup.model, Device::cpu(), *fp32_setup.optimizer, fp32_setup.scheduler.get(),
                  {.log_bar = false});
  MlpTrainer bf16(*bf16_setup.model, Device::cpu(), *bf16_setup.optimizer, bf16_setup.scheduler.get(),
                  {.log_bar = false, .precision = nn::Precision::bf16});
  fp32.run(6, loader);
  bf16.run(6, loader);
  const double fp32_loss = fp32.history().back().train.at("loss"), bf16_loss = bf16.history().back().train.at("loss");
  CHECK(bf16_loss < 0.8 * bf16.history().front().train.at("loss"));           // it learns
  CHECK(std::fabs(bf16_loss - fp32_loss) < 0.05 * fp32_loss);                 // about as well
  CHECK(flat_weights(*bf16_setup.model) != flat_weights(*fp32_setup.model));  // in other arithmetic
  CHECK(bf16.global_step() == 36);

  TempDir dir;
  nn::save_checkpoint(dir.file("bf16.safetensors"), *bf16_setup.model, bf16_setup.optimizer.get(),
                      bf16_setup.scheduler.get(), {.epoch = 6, .step = bf16.global_step(), .extra = {}});
  const SafetensorsFile file = load_safetensors(dir.file("bf16.safetensors"));
  CHECK(file.tensors.size() == 12);  // 4 weights and biases, and Adam's two moments of each
  for (const auto& [name, tensor] : file.tensors) {
    CAPTURE(name);
    CHECK(tensor.dtype() == DType::f32);
  }
  CHECK(file.get("0.weight").to_vector<float>() == bf16_setup.model->parameter("0.weight").value.to_vector<float>());
}

TEST_CASE(
    "Trainer: fp16 skips the steps an oversized scale overflows, backs off, trains on, and checkpoints the scaler") {
  auto data = three_class_data(kSamples, 4);
  nn::DataLoader loader(data, {.batch_size = kBatch});
  Setup s;
  // 2^24 times a loss gradient of up to 1/16 is far past fp16's 65504: the first steps overflow.
  const nn::LossScalerOptions scaling{.init_scale = 0x1p24, .growth_interval = 1000};
  MlpTrainer trainer(*s.model, Device::cpu(), *s.optimizer, s.scheduler.get(),
                     {.log_bar = false, .precision = nn::Precision::fp16, .loss_scaler = scaling});
  const std::vector<float> before = flat_weights(*s.model);
  trainer.run(3, loader);
  const nn::LossScaler& scaler = *trainer.loss_scaler();
  const int64_t skipped = trainer.skipped_steps();
  CHECK(skipped >= 1);
  CHECK(skipped < 18);
  CHECK(scaler.skipped_steps() == skipped);
  CHECK(trainer.global_step() + skipped == 18);
  CHECK(scaler.scale() == std::ldexp(1.0, 24 - int(skipped)));  // halved once per skip, never grown
  CHECK(all_finite(flat_weights(*s.model)));                    // no inf step reached the weights
  CHECK(flat_weights(*s.model) != before);
  CHECK(trainer.history().back().train.at("loss") < trainer.history().front().train.at("loss"));

  // The scaler's state goes into a checkpoint with the progress, and comes back from it.
  TempDir dir;
  nn::save_checkpoint(dir.file("fp16.safetensors"), *s.model, s.optimizer.get(), s.scheduler.get(),
                      {.epoch = 3, .step = trainer.global_step(), .extra = trainer.progress_metadata()});
  Setup fresh;
  MlpTrainer resumed(*fresh.model, Device::cpu(), *fresh.optimizer, fresh.scheduler.get(),
                     {.log_bar = false, .precision = nn::Precision::fp16, .loss_scaler = scaling});
  nn::CheckpointInfo info = nn::load_checkpoint(dir.file("fp16.safetensors"), *fresh.model, fresh.optimizer.get(),
                                                fresh.scheduler.get());
  resumed.restore_progress(info.extra, info.epoch);
  CHECK(resumed.loss_scaler()->state() == scaler.state());
  CHECK(resumed.loss_scaler()->scale() == scaler.scale());
}

// ---- under DDP: one rank overflows, every rank skips ------------------------------------------------

namespace {

// On rank 1, the third step's loss gradient is 2^20 times too large, as a batch that overflows fp16
// on one rank only: its rounded dy is infinite there, and finite on rank 0.
class OneRankOverflows : public MlpTrainer {
 public:
  using MlpTrainer::MlpTrainer;
  nn::StepOutput train_step(const nn::Batch& batch) override {
    nn::StepOutput step = MlpTrainer::train_step(batch);
    if (rank() == 1 && ++steps_ == 3) kernels::scale(step.output_grad, 0x1p20f);
    return step;
  }

 private:
  int steps_ = 0;  // train_step calls (global_step does not count a skipped step)
};
using Spawning = nn::WithAddOns<OneRankOverflows, nn::MultiDevice>;
constexpr const char* kCase =
    "Trainer: fp16 under MultiDevice skips on both ranks when only rank 1's gradients overflow";

}  // namespace

TEST_CASE(kCase) {
  const bool worker = nn::detect_process_role(2) == nn::ProcessRole::spawned_worker;
  Setup s(5, 1e-2);
  nn::DataLoader loader(three_class_data(100, 13), {.batch_size = 10});  // 5 steps of 10 rows per rank
  Spawning trainer(*s.model, std::vector<Device>(2, Device::cpu()), *s.optimizer, nullptr,
                   {.log_bar = false,
                    .precision = nn::Precision::fp16,
                    .loss_scaler = {.init_scale = 1024, .growth_interval = 1000}});
  trainer.multi_device_options().worker_command = {nn::this_program_command()[0], std::string("--test-case=") + kCase,
                                                   "--no-intro=true"};
  trainer.multi_device_options().timeout = std::chrono::seconds(120);
  trainer.run(1, loader);
  // Every rank -- rank 0 too, whose own gradients were finite -- skipped that one step and halved its scale.
  const nn::LossScaler& scaler = *trainer.loss_scaler();
  CHECK(scaler.skipped_steps() == 1);
  CHECK(scaler.scale() == 512);
  if (worker) {
    CHECK(trainer.skipped_steps() == 1);
    return;
  }
  CHECK(trainer.global_step() == 4);  // rank 0's progress, handed back to the spawner
  CHECK(all_finite(flat_weights(*s.model)));
}
