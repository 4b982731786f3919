// The Trainer as a user meets it, in one process: a cosine schedule sized by the run, predict() for
// inputs without targets, a subclass's own state carried through checkpoints, and what StateManager
// says when it resumes. (The same under MultiDevice: test_trainer_multi_device.cpp.)
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "tinyddp/nn/train/addons/state_manager.h"
#include "test/nn/train/test_trainer_support.h"

using namespace tinyddp;
using namespace tinyddp::testing;

namespace {

nn::DataLoader loader_of(int64_t samples, int64_t batch) {
  return nn::DataLoader(three_class_data(samples, 11), {.batch_size = batch, .shuffle = true, .seed = 3});
}

// A user's trainer with members of its own: how many batches it trained on and the last loss.
class CountingTrainer : public MlpTrainer {
 public:
  using MlpTrainer::MlpTrainer;
  int64_t batches_seen = 0;
  std::string note;

  nn::StepOutput train_step(const nn::Batch& batch) override {
    ++batches_seen;
    return MlpTrainer::train_step(batch);
  }
  Metadata get_extra_state() const override { return {{"batches_seen", std::to_string(batches_seen)}, {"note", note}}; }
  void set_extra_state(const Metadata& state) override {
    batches_seen = std::stoll(state.at("batches_seen"));
    note = state.at("note");
  }
};

}  // namespace

TEST_CASE("a cosine schedule built with length_of_run lasts exactly the run: per batch and per epoch") {
  for (bool per_batch : {true, false}) {
    CAPTURE(per_batch);
    Setup s;
    nn::CosineAnnealing schedule(*s.optimizer, nn::length_of_run);
    CHECK(schedule.sized_by_run());
    CHECK(s.optimizer->lr() == 1e-2);            // its start is known before the run sizes it
    nn::DataLoader loader = loader_of(100, 16);  // 7 batches
    MlpTrainer trainer(*s.model, Device::cpu(), *s.optimizer, &schedule,
                       {.log_bar = false, .scheduler_step_on_batch = per_batch});
    trainer.run(3, loader);
    CHECK(schedule.total_iters() == (per_batch ? 3 * 7 : 3));
    CHECK(schedule.last_step() == schedule.total_iters());
    CHECK(s.optimizer->lr() == 0.0);  // eta_min + (base - eta_min)(1 + cos(pi))/2, exactly
  }
  // Stepped by hand before any run has sized it: an error that says what to do.
  Setup s;
  nn::CosineAnnealing unsized(*s.optimizer, nn::length_of_run);
  CHECK_THROWS_WITH_AS(unsized.step(), doctest::Contains("before a Trainer's run() gave it a length"), Error);
  nn::CosineAnnealing fixed(*s.optimizer, 10);
  CHECK_THROWS_WITH_AS(fixed.set_length_of_run(5), doctest::Contains("build it with nn::length_of_run"), Error);
}

TEST_CASE("predict runs the model on inputs without targets, in row blocks, and stacks the outputs") {
  Setup s;
  // A GEMM library may block a product of fewer rows differently (oneDNN does), which changes the
  // rounding of an inexact forward pass; on this grid the forward pass is exact (exact_forward), so a
  // block of rows gives each row the bits the whole batch gives it, and a misplaced row shows.
  exact_forward(*s.model);
  MlpTrainer trainer(*s.model, Device::cpu(), *s.optimizer, nullptr, {.log_bar = false});
  auto data = three_class_data(50, 4, true);
  const std::vector<float> whole = s.model->forward(data->features()).to_vector<float>();
  for (int64_t block : {int64_t(7), int64_t(50), int64_t(1000)}) {
    CAPTURE(block);
    Tensor out = trainer.predict(data->features(), block);
    CHECK(out.shape() == Shape{50, 3});
    check_identical(out.to_vector<float>(), whole, "predict in row blocks");
  }
  // From a loader: its targets are not read, the order is the loader's.
  nn::DataLoader ordered(data, {.batch_size = 16});
  check_identical(trainer.predict(ordered).to_vector<float>(), whole, "predict over a loader");
  CHECK_THROWS_WITH_AS(trainer.predict(data->features(), 0), doctest::Contains("batch_size is 0"), Error);
  CHECK_THROWS_WITH_AS(trainer.predict(Tensor()), doctest::Contains("with the samples along the first dimension"),
                       Error);
}

TEST_CASE("a subclass's own state goes into the training state and comes back with it") {
  TempDir dir;
  Setup a;
  nn::DataLoader loader = loader_of(100, 16);
  nn::WithAddOns<CountingTrainer, nn::StateManager> first(*a.model, Device::cpu(), *a.optimizer, a.scheduler.get(),
                                                          {.log_bar = false});
  first.note = "kept";
  first.set_checkpoint_dir(dir.file("ck"));
  first.run(2, loader);
  CHECK(first.batches_seen == 14);

  // A new process would start with fresh members; the checkpoint brings them back.
  Setup b(1234);
  nn::WithAddOns<CountingTrainer, nn::StateManager> again(*b.model, Device::cpu(), *b.optimizer, b.scheduler.get(),
                                                          {.log_bar = false});
  again.set_checkpoint_dir(dir.file("ck"));
  again.run(3, loader);
  CHECK(again.note == "kept");
  CHECK(again.batches_seen == 21);  // 14 restored, 7 more in the third epoch
}

TEST_CASE("StateManager says that it resumes, and that nothing is left when every epoch is done") {
  TempDir dir;
  Setup a;
  nn::DataLoader loader = loader_of(40, 16);
  using Managed = nn::WithAddOns<MlpTrainer, nn::StateManager>;
  {
    Managed first(*a.model, Device::cpu(), *a.optimizer, a.scheduler.get(), {.log_bar = false});
    first.set_checkpoint_dir(dir.file("ck"));
    first.run(2, loader);
  }
  const std::string last = dir.file("ck/last.safetensors");
  for (int64_t epochs : {2, 3}) {  // all done, then one more
    CAPTURE(epochs);
    Setup b;
    Managed again(*b.model, Device::cpu(), *b.optimizer, b.scheduler.get(), {.log_bar = false});
    again.set_checkpoint_dir(dir.file("ck"));
    CapturedStderr captured;
    again.run(epochs, loader);
    const std::string said = captured.text();
    INFO("stderr: ", said);
    CHECK(said.find("resuming from " + last + ": 2 of " + std::to_string(epochs) + " epochs done") !=
          std::string::npos);
    CHECK((said.find("nothing left to train") != std::string::npos) == (epochs == 2));
    CHECK((said.find("/*resume=*/false") != std::string::npos) == (epochs == 2));
  }
}
