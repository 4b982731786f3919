// Trainer on one device: it computes what a hand-written loop computes (the second implementation),
// its epoch means are sample-weighted means, the best weights are a copy, the scheduler steps when
// asked, epochs count across runs; the progress bar; StateManager resumes bitwise; Trace writes
// the timeline.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "tinyddp/core/safetensors.h"
#include "tinyddp/nn/optim/clip.h"
#include "tinyddp/nn/train/addons/state_manager.h"
#include "tinyddp/nn/train/addons/trace.h"
#include "tinyddp/nn/train/checkpoint.h"
#include "tinyddp/nn/train/progress_bar.h"
#include "test/nn/train/test_trainer_support.h"
#include "test/test_support.h"

using namespace tinyddp;
using namespace tinyddp::testing;

namespace {

constexpr int64_t kSamples = 100, kBatch = 16;  // 7 batches: six of 16 and a short one of 4

nn::DataLoader shuffled_loader(uint64_t seed = 3) {
  return nn::DataLoader(three_class_data(kSamples, 11), {.batch_size = kBatch, .shuffle = true, .seed = seed});
}

nn::DataLoader ordered_loader(uint64_t data_seed = 11) {
  return nn::DataLoader(three_class_data(kSamples, data_seed), {.batch_size = kBatch});
}

// A trainer that keeps a copy of the weights at the end of every epoch, to compare best_weights() with.
class SnapshotTrainer : public MlpTrainer {
 public:
  using MlpTrainer::MlpTrainer;
  std::vector<std::vector<float>> snapshots;

 protected:
  void on_epoch_end(const nn::EpochRecord& record) override {
    MlpTrainer::on_epoch_end(record);
    snapshots.push_back(flat_weights(model()));
  }
};

std::vector<float> flat(const NamedTensors& tensors) {
  std::vector<float> out;
  for (const auto& [name, t] : tensors) {
    std::vector<float> v = t.to_vector<float>();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

}  // namespace

TEST_CASE("the Trainer computes exactly what the hand-written loop computes (clipping, per-batch cosine)") {
  const int64_t epochs = 3;
  nn::TrainerOptions options{.log_bar = false, .scheduler_step_on_batch = true, .gradient_clip = 0.5};

  Setup a(7, 1e-2, epochs * 7);
  nn::DataLoader loader_a = shuffled_loader();
  MlpTrainer trainer(*a.model, Device::cpu(), *a.optimizer, a.scheduler.get(), options);
  trainer.run(epochs, loader_a);

  // The same job written out by hand, as examples/dummy does it.
  Setup b(7, 1e-2, epochs * 7);
  nn::DataLoader loader_b = shuffled_loader();
  nn::CrossEntropyLoss loss_fn;
  std::vector<double> epoch_loss, epoch_accuracy;
  for (int64_t e = 0; e < epochs; ++e) {
    loader_b.set_epoch(e);
    double loss_sum = 0, correct = 0, seen = 0;
    for (const nn::Batch& batch : loader_b) {
      b.optimizer->zero_grad();
      Tensor logits = b.model->forward(batch.inputs);
      float loss = loss_fn.forward(logits, batch.targets);
      b.model->backward(loss_fn.backward(), false);
      nn::clip_grad_norm(b.model->parameters(), 0.5);
      b.optimizer->step();
      b.scheduler->step();
      loss_sum += double(loss) * double(batch.inputs.size(0));
      correct += double(kernels::count_correct(logits, batch.targets));
      seen += double(batch.inputs.size(0));
    }
    epoch_loss.push_back(loss_sum / seen);
    epoch_accuracy.push_back(correct / seen);
  }

  CHECK(flat_weights(*a.model) == flat_weights(*b.model));  // bitwise
  CHECK(a.optimizer->lr() == b.optimizer->lr());
  CHECK(trainer.global_step() == epochs * 7);
  CHECK(trainer.epochs_done() == epochs);
  REQUIRE(trainer.history().size() == size_t(epochs));
  for (int64_t e = 0; e < epochs; ++e) {
    const nn::EpochRecord& r = trainer.history()[size_t(e)];
    CHECK(r.epoch == e);
    CHECK(r.train.at("loss") == doctest::Approx(epoch_loss[size_t(e)]).epsilon(1e-12));
    CHECK(r.train.at("accuracy") == doctest::Approx(epoch_accuracy[size_t(e)]).epsilon(1e-12));
    CHECK(r.valid.empty());
  }
  CHECK(trainer.history().back().train.at("loss") < trainer.history().front().train.at("loss"));
}

TEST_CASE("epoch means weigh each batch by its size: with lr 0 they equal the loss over the whole set") {
  Setup s(5, /*lr=*/0.0);
  // Weights and features on a grid where the forward pass is exact (exact_forward): batches of 16 and
  // the whole set of 100 give every row the same logits, and so the same loss, to the bit.
  exact_forward(*s.model);
  nn::DataLoader loader(three_class_data(kSamples, 11, true), {.batch_size = kBatch, .shuffle = true, .seed = 3});
  nn::DataLoader valid(three_class_data(kSamples, 12, true), {.batch_size = kBatch});
  MlpTrainer trainer(*s.model, Device::cpu(), *s.optimizer, nullptr, {.log_bar = false});
  trainer.run(2, loader, &valid);

  auto whole = [&](const nn::TensorDataset& data) {
    nn::CrossEntropyLoss loss_fn;
    return double(loss_fn.evaluate(s.model->forward(data.features()), data.targets()));
  };
  double train_loss = whole(*three_class_data(kSamples, 11, true)),
         valid_loss = whole(*three_class_data(kSamples, 12, true));
  // The row losses being equal, only the means round differently: each batch's mean is rounded to
  // float once (relative error <= u = 2^-24), and so is the whole set's; the sums and divisions in
  // double add at most about a hundred times 2^-53 = u / 2^29 more. The weighted mean of the batch
  // means is the whole mean L, so the two differ by at most u L + u L plus those: 3u L bounds it.
  auto within_rounding_of_means = [](double got, double whole_mean) {
    return std::fabs(got - whole_mean) <= 3 * 0x1p-24 * std::fabs(whole_mean);
  };
  for (const nn::EpochRecord& r : trainer.history()) {
    CHECK(within_rounding_of_means(r.train.at("loss"), train_loss));
    CHECK(within_rounding_of_means(r.valid.at("loss"), valid_loss));
  }

  // inference(): every batch's output stacked in loader order, and the same means.
  nn::InferenceResult result = trainer.inference(valid);
  Tensor expected = s.model->forward(three_class_data(kSamples, 12, true)->features());
  REQUIRE(result.outputs.shape() == Shape{kSamples, 3});
  check_identical(result.outputs.to_vector<float>(), expected.to_vector<float>(), "inference outputs");
  CHECK(within_rounding_of_means(result.metrics.at("loss"), valid_loss));
  CHECK(result.metrics.count("accuracy") == 1);
}

TEST_CASE("the best weights are a copy of the weights after the best epoch, not a reference to the model") {
  Setup s(9, 5e-2);
  nn::DataLoader loader = shuffled_loader();
  nn::DataLoader valid = ordered_loader(12);
  SnapshotTrainer trainer(*s.model, Device::cpu(), *s.optimizer, s.scheduler.get(), {.log_bar = false});
  trainer.run(6, loader, &valid);

  // The best epoch is the one with the lowest validation loss.
  size_t best = 0;
  for (size_t e = 1; e < trainer.history().size(); ++e)
    if (trainer.history()[e].valid.at("loss") < trainer.history()[best].valid.at("loss")) best = e;
  REQUIRE(trainer.best_epoch().has_value());
  CHECK(*trainer.best_epoch() == int64_t(best));
  CHECK(trainer.best_loss() == trainer.history()[best].valid.at("loss"));
  CHECK(flat(trainer.best_weights()) == trainer.snapshots[best]);

  // Changing the model afterwards does not change the kept copy; apply_best_weights brings it back.
  for (nn::Parameter* p : s.model->parameters()) kernels::fill(p->value, 0.25f);
  CHECK(flat(trainer.best_weights()) == trainer.snapshots[best]);
  trainer.apply_best_weights();
  CHECK(flat_weights(*s.model) == trainer.snapshots[best]);
}

TEST_CASE("the scheduler steps once per epoch by default, once per batch when asked") {
  const int64_t epochs = 4;
  {
    Setup s(1, 1e-2, 10);
    nn::DataLoader loader = shuffled_loader();
    MlpTrainer trainer(*s.model, Device::cpu(), *s.optimizer, s.scheduler.get(), {.log_bar = false});
    trainer.run(epochs, loader);
    CHECK(s.scheduler->last_step() == epochs);
    for (int64_t e = 0; e < epochs; ++e) CHECK(trainer.history()[size_t(e)].lr == s.scheduler->lr_at(e + 1));
  }
  {
    Setup s(1, 1e-2, epochs * 7);
    nn::DataLoader loader = shuffled_loader();
    MlpTrainer trainer(*s.model, Device::cpu(), *s.optimizer, s.scheduler.get(),
                       {.log_bar = false, .scheduler_step_on_batch = true});
    trainer.run(epochs, loader);
    CHECK(s.scheduler->last_step() == epochs * 7);
    CHECK(s.optimizer->lr() == s.scheduler->lr_at(epochs * 7));
  }
}

TEST_CASE("a per-batch cosine schedule shorter than the run is refused before training, as the seed asserts") {
  Setup s(1, 1e-2, /*total_iters=*/10);
  nn::DataLoader loader = shuffled_loader();
  MlpTrainer trainer(*s.model, Device::cpu(), *s.optimizer, s.scheduler.get(),
                     {.log_bar = false, .scheduler_step_on_batch = true});
  std::vector<float> before = flat_weights(*s.model);
  CHECK_THROWS_WITH(trainer.run(3, loader), doctest::Contains("total_iters >= 21"));
  CHECK(flat_weights(*s.model) == before);
}

TEST_CASE("trainer errors say what was wrong") {
  class NoGradTrainer : public MlpTrainer {
   public:
    using MlpTrainer::MlpTrainer;
    nn::StepOutput train_step(const nn::Batch& batch) override { return {.loss = float(batch.inputs.size(0))}; }
  };
  Setup s;
  nn::DataLoader loader = shuffled_loader();
  NoGradTrainer trainer(*s.model, Device::cpu(), *s.optimizer, nullptr, {.log_bar = false});
  CHECK_THROWS_WITH(trainer.run(1, loader), doctest::Contains("train_step returned no output_grad"));
  CHECK_THROWS_WITH(trainer.apply_best_weights(), doctest::Contains("no best weights yet"));
  CHECK_THROWS_WITH(MlpTrainer(*s.model, std::vector<Device>{}, *s.optimizer, nullptr),
                    doctest::Contains("device list is empty"));
  Setup other;
  CHECK_THROWS_WITH(MlpTrainer(*s.model, Device::cpu(), *s.optimizer, other.scheduler.get()),
                    doctest::Contains("another optimizer"));
}

TEST_CASE("epochs count across run() calls: run(2) then run(3) is run(3)") {
  Setup a, b;
  nn::DataLoader loader_a = shuffled_loader(), loader_b = shuffled_loader();
  MlpTrainer once(*a.model, Device::cpu(), *a.optimizer, a.scheduler.get(), {.log_bar = false});
  once.run(3, loader_a);
  MlpTrainer twice(*b.model, Device::cpu(), *b.optimizer, b.scheduler.get(), {.log_bar = false});
  twice.run(2, loader_b);
  CHECK(twice.epochs_done() == 2);
  twice.run(3, loader_b);
  CHECK(twice.epochs_done() == 3);
  CHECK(twice.history().size() == 3);
  CHECK(flat_weights(*a.model) == flat_weights(*b.model));
  twice.run(3, loader_b);  // nothing left to do
  CHECK(twice.global_step() == once.global_step());
}

TEST_CASE("progress_metadata and restore_progress carry the history and the best epoch exactly") {
  Setup s;
  nn::DataLoader loader = shuffled_loader(), valid = ordered_loader(12);
  MlpTrainer trainer(*s.model, Device::cpu(), *s.optimizer, s.scheduler.get(), {.log_bar = false});
  trainer.run(3, loader, &valid);

  Setup t;
  MlpTrainer restored(*t.model, Device::cpu(), *t.optimizer, t.scheduler.get(), {.log_bar = false});
  restored.restore_progress(trainer.progress_metadata(), 3);
  CHECK(restored.epochs_done() == 3);
  CHECK(restored.global_step() == trainer.global_step());
  CHECK(restored.best_epoch() == trainer.best_epoch());
  CHECK(restored.best_loss() == trainer.best_loss());
  REQUIRE(restored.history().size() == 3);
  for (size_t e = 0; e < 3; ++e) {
    CHECK(restored.history()[e].train == trainer.history()[e].train);
    CHECK(restored.history()[e].valid == trainer.history()[e].valid);
    CHECK(restored.history()[e].lr == trainer.history()[e].lr);
  }
  // Restoring to an earlier epoch keeps only the history up to it.
  restored.restore_progress(trainer.progress_metadata(), 1);
  CHECK(restored.history().size() == 1);
  CHECK_THROWS_WITH(restored.restore_progress({{"trainer.history", "[{\"epoch\": 0}"}}, 1),
                    doctest::Contains("does not parse"));
}

TEST_CASE("the progress bar: plain lines in a file, a bar redrawn in place on a terminal") {
  auto read_all = [](std::FILE* f) {
    std::fflush(f);
    std::rewind(f);
    std::string text;
    for (int c; (c = std::fgetc(f)) != EOF;) text += char(c);
    return text;
  };
  {
    std::FILE* f = std::tmpfile();
    REQUIRE(f != nullptr);
    {
      nn::ProgressBar bar(f, false);  // plain, with the default 10 s interval: no batch lines in a short epoch
      CHECK_FALSE(bar.live());
      for (int i = 1; i <= 5; ++i) bar.update(0, 2, "train", i, 5, 0.5, 1e-3);
      bar.line("epoch 1/2  train loss 0.5000");
    }
    CHECK(read_all(f) == "epoch 1/2  train loss 0.5000\n");
    std::fclose(f);
  }
  {
    std::FILE* f = std::tmpfile();
    REQUIRE(f != nullptr);
    {
      nn::ProgressBar bar(f, false, std::chrono::milliseconds(0));  // a batch line whenever one is due
      for (int i = 1; i <= 3; ++i) bar.update(1, 2, "train", i, 3, 0.25, 2e-3);
    }
    // The first batch starts the clock and the last is covered by the summary: one line, batch 2.
    CHECK(read_all(f) == "epoch   2/2  train    2/3  loss 0.2500  lr 2.000e-03\n");
    std::fclose(f);
  }
  {
    std::FILE* f = std::tmpfile();
    REQUIRE(f != nullptr);
    {
      nn::ProgressBar bar(f, true);
      bar.update(0, 1, "train", 4, 4, 0.125, 1e-3);  // the last batch is always drawn
      bar.line("done");
    }
    std::string text = read_all(f);
    CHECK(text.find("\repoch   1/1  train    4/4 [########################]  loss 0.1250  lr 1.000e-03") == 0);
    CHECK(text.size() > 5);
    CHECK(text.substr(text.size() - 5) == "done\n");
    std::fclose(f);
  }
}

TEST_CASE("add-ons compose in any order: WithAddOns<T, A, B> is A<B<T>>") {
  static_assert(
      std::is_same_v<nn::WithAddOns<MlpTrainer, nn::StateManager, nn::Trace>, nn::StateManager<nn::Trace<MlpTrainer>>>);
  static_assert(std::is_same_v<nn::WithAddOns<MlpTrainer>, MlpTrainer>);
  static_assert(std::is_base_of_v<nn::Trainer, nn::WithAddOns<MlpTrainer, nn::Trace, nn::StateManager>>);
  CHECK(true);
}

TEST_CASE(
    "StateManager: checkpoints every epoch and at the best loss, and a resumed run matches an uninterrupted one") {
  using Managed = nn::WithAddOns<MlpTrainer, nn::StateManager>;
  const int64_t epochs = 4;
  TempDir dir;

  Setup a;
  nn::DataLoader loader_a = shuffled_loader(), valid_a = ordered_loader(12);
  Managed uninterrupted(*a.model, Device::cpu(), *a.optimizer, a.scheduler.get(), {.log_bar = false});
  uninterrupted.set_checkpoint_dir(dir.file("a"));
  uninterrupted.run(epochs, loader_a, &valid_a);
  CHECK_FALSE(uninterrupted.resumed_from().has_value());
  CHECK(nn::checkpoint_exists(dir.file("a/last.safetensors")));
  CHECK(nn::checkpoint_exists(dir.file("a/best.safetensors")));
  // last.safetensors holds the final weights, readable as a plain model file (what PyTorch loads).
  Setup check_model(99);
  nn::load_model(dir.file("a/last.safetensors"), *check_model.model, {.allow_unexpected = true});
  CHECK(flat_weights(*check_model.model) == flat_weights(*a.model));
  SafetensorsFile best = load_safetensors(dir.file("a/best.safetensors"));
  CHECK(best.metadata.at("tinyddp.epoch") == std::to_string(*uninterrupted.best_epoch() + 1));

  // The same run stopped after 2 epochs, then started again from scratch objects (another initial
  // model even) with the same directory: it resumes at epoch 2 and ends bitwise where the other did.
  {
    Setup b;
    nn::DataLoader loader_b = shuffled_loader(), valid_b = ordered_loader(12);
    Managed first(*b.model, Device::cpu(), *b.optimizer, b.scheduler.get(), {.log_bar = false});
    first.set_checkpoint_dir(dir.file("b"));
    first.run(2, loader_b, &valid_b);
  }
  Setup c(/*model_seed=*/1234);
  nn::DataLoader loader_c = shuffled_loader(), valid_c = ordered_loader(12);
  Managed resumed(*c.model, Device::cpu(), *c.optimizer, c.scheduler.get(), {.log_bar = false});
  resumed.set_checkpoint_dir(dir.file("b"));
  resumed.run(epochs, loader_c, &valid_c);
  REQUIRE(resumed.resumed_from().has_value());
  CHECK(*resumed.resumed_from() == 2);
  CHECK(flat_weights(*c.model) == flat_weights(*a.model));
  CHECK(c.optimizer->step_count() == a.optimizer->step_count());
  CHECK(c.scheduler->last_step() == a.scheduler->last_step());
  CHECK(resumed.history().size() == size_t(epochs));
  CHECK(resumed.best_epoch() == uninterrupted.best_epoch());
  CHECK(flat(resumed.best_weights()) == flat(uninterrupted.best_weights()));
  for (size_t e = 0; e < size_t(epochs); ++e) CHECK(resumed.history()[e].valid == uninterrupted.history()[e].valid);

  // resume = false starts over and overwrites.
  Setup d;
  nn::DataLoader loader_d = shuffled_loader();
  Managed fresh(*d.model, Device::cpu(), *d.optimizer, d.scheduler.get(), {.log_bar = false});
  fresh.set_checkpoint_dir(dir.file("b"), /*resume=*/false);
  fresh.run(1, loader_d);
  CHECK_FALSE(fresh.resumed_from().has_value());
  CHECK(load_safetensors(dir.file("b/last.safetensors")).metadata.at("tinyddp.epoch") == "1");
}

namespace {

// Records the size of last.safetensors after each epoch's checkpoint.
class SizeWatchingTrainer : public nn::WithAddOns<MlpTrainer, nn::StateManager> {
 public:
  using nn::WithAddOns<MlpTrainer, nn::StateManager>::WithAddOns;
  std::vector<uintmax_t> sizes;

 protected:
  void on_epoch_end(const nn::EpochRecord& record) override {
    nn::WithAddOns<MlpTrainer, nn::StateManager>::on_epoch_end(record);
    sizes.push_back(std::filesystem::file_size(last_checkpoint_path()));
  }
};

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

}  // namespace

TEST_CASE(
    "StateManager: the checkpoint keeps one size across epochs, the history goes to history.jsonl and comes "
    "back on resuming") {
  const int64_t epochs = 30;
  TempDir dir;
  Setup a;
  nn::DataLoader loader_a = shuffled_loader(), valid_a = ordered_loader(12);
  SizeWatchingTrainer uninterrupted(*a.model, Device::cpu(), *a.optimizer, a.scheduler.get(), {.log_bar = false});
  uninterrupted.set_checkpoint_dir(dir.file("a"));
  uninterrupted.run(epochs, loader_a, &valid_a);
  REQUIRE(uninterrupted.sizes.size() == size_t(epochs));
  // Each epoch's record is about 150 bytes of JSON: inside the checkpoint, 30 of them would add kilobytes.
  // What may change is a few digits (the epoch, the step, the best loss's shortest text).
  const auto [smallest, largest] = std::minmax_element(uninterrupted.sizes.begin(), uninterrupted.sizes.end());
  CHECK_MESSAGE(*largest - *smallest <= 32, "last.safetensors went from ", *smallest, " to ", *largest, " bytes");
  CHECK(lines_of(dir.file("a/history.jsonl")).size() == size_t(epochs));
  CHECK(load_safetensors(dir.file("a/last.safetensors")).metadata.count("trainer.history") == 0);

  // Stopped after 2 epochs, resumed to 30: the history is the uninterrupted run's, record for record.
  {
    Setup b;
    nn::DataLoader loader_b = shuffled_loader(), valid_b = ordered_loader(12);
    SizeWatchingTrainer first(*b.model, Device::cpu(), *b.optimizer, b.scheduler.get(), {.log_bar = false});
    first.set_checkpoint_dir(dir.file("b"));
    first.run(2, loader_b, &valid_b);
  }
  // As a crash leaves it: the line of an epoch the checkpoint never recorded, and half a line.
  nn::EpochRecord never_checkpointed;
  never_checkpointed.epoch = 2;
  never_checkpointed.train = {{"loss", 12345.0}};
  {
    std::ofstream(dir.file("b/history.jsonl"), std::ios::app)
        << nn::epoch_record_json(never_checkpointed) << "\n{\"epoch\": 3, \"tr";
  }
  Setup c(/*model_seed=*/99);
  nn::DataLoader loader_c = shuffled_loader(), valid_c = ordered_loader(12);
  SizeWatchingTrainer resumed(*c.model, Device::cpu(), *c.optimizer, c.scheduler.get(), {.log_bar = false});
  resumed.set_checkpoint_dir(dir.file("b"));
  resumed.run(epochs, loader_c, &valid_c);
  REQUIRE(resumed.resumed_from() == 2);
  REQUIRE(resumed.history().size() == size_t(epochs));
  for (size_t e = 0; e < size_t(epochs); ++e) {
    CHECK(resumed.history()[e].epoch == int64_t(e));
    CHECK(resumed.history()[e].train == uninterrupted.history()[e].train);
    CHECK(resumed.history()[e].valid == uninterrupted.history()[e].valid);
    CHECK(resumed.history()[e].lr == uninterrupted.history()[e].lr);
  }
  CHECK(flat_weights(*c.model) == flat_weights(*a.model));
  const std::vector<std::string> lines = lines_of(dir.file("b/history.jsonl"));
  REQUIRE(lines.size() == size_t(epochs));
  for (size_t e = 0; e < lines.size(); ++e) CHECK(nn::epoch_record_from_json(lines[e]).epoch == int64_t(e));
  CHECK(std::max(resumed.sizes.back(), *largest) - std::min(resumed.sizes.back(), *smallest) <= 32);
}

TEST_CASE("StateManager refuses a checkpoint directory it cannot use") {
  using Managed = nn::WithAddOns<MlpTrainer, nn::StateManager>;
  TempDir dir;
  { std::ofstream(dir.file("plain_file")) << "x"; }
  Setup s;
  nn::DataLoader loader = shuffled_loader();
  Managed trainer(*s.model, Device::cpu(), *s.optimizer, nullptr, {.log_bar = false});
  // A file in the way is said as such (not blamed on permissions).
  trainer.set_checkpoint_dir(dir.file("plain_file"));
  const std::string a_file = "the checkpoint directory " + dir.file("plain_file") +
                             " is a file, not a directory; hint: give a directory";
  CHECK_THROWS_WITH(trainer.run(1, loader), doctest::Contains(a_file.c_str()));
  // A path that cannot be made: under a file.
  trainer.set_checkpoint_dir(dir.file("plain_file/run"));
  CHECK_THROWS_WITH(trainer.run(1, loader), doctest::Contains("cannot create the checkpoint directory"));
}

TEST_CASE("Trace writes a Chrome-trace timeline with the step's spans on the compute lane") {
  using Traced = nn::WithAddOns<MlpTrainer, nn::Trace>;
  TempDir dir;
  Setup s;
  nn::DataLoader loader = shuffled_loader();
  Traced trainer(*s.model, Device::cpu(), *s.optimizer, s.scheduler.get(), {.log_bar = false});
  trainer.set_trace_file(dir.file("run.json"));
  trainer.run(2, loader);
  REQUIRE(trainer.trace_file() == dir.file("run.json"));

  std::ifstream in(trainer.trace_file());
  nlohmann::json trace = nlohmann::json::parse(in);
  std::map<std::string, int> spans;
  std::set<std::string> instants;
  int64_t previous_step_end = 0;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.at("ph") == "X") {
      CHECK(e.at("dur").get<int64_t>() >= 0);
      CHECK(e.at("pid") == 0);
      std::string name = e.at("name");
      ++spans[name];
      if (name == "optimizer step") {
        CHECK(e.at("tid") == int(trace::Lane::compute));
        CHECK(e.at("ts").get<int64_t>() >= previous_step_end);  // one step after another
        previous_step_end = e.at("ts").get<int64_t>() + e.at("dur").get<int64_t>();
      }
    } else if (e.at("ph") == "i") {
      instants.insert(e.at("name").get<std::string>());
    }
  }
  // Every batch has its train_step, backward and optimizer step (this run's, at least: the recorder
  // is process-wide and may hold other tests' events too).
  CHECK(spans["optimizer step"] >= 14);
  CHECK(spans["train_step"] >= 14);
  CHECK(spans["backward pass"] >= 14);
  CHECK(spans["backward 2 Linear"] >= 14);  // and each layer, from Sequential
  CHECK(spans["forward 1 ReLU"] >= 14);
  CHECK(instants.count("run begins") == 1);
  CHECK(instants.count("run ends") == 1);
}
