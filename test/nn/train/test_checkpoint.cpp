// Checkpoints: PyTorch names and layout, exact resume, every bad file refused with the model, the
// optimizer and the scheduler left untouched, and a save killed mid-write never damaging the old file;
// the same for StateManager's pair of files (last and best), which must also agree with each other.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tinyddp/core/random.h"
#include "tinyddp/core/safetensors.h"
#include "tinyddp/nn/activations.h"
#include "tinyddp/nn/linear.h"
#include "tinyddp/nn/loss.h"
#include "tinyddp/nn/optim/adam.h"
#include "tinyddp/nn/optim/schedulers.h"
#include "tinyddp/nn/optim/sgd.h"
#include "tinyddp/nn/sequential.h"
#include "tinyddp/nn/train/addons/state_manager.h"
#include "tinyddp/nn/train/checkpoint.h"
#include "test/comm/helpers/child_process.h"
#include "test/nn/mlp_rounding_bound.h"
#include "test/nn/train/test_trainer_support.h"
#include "test/test_support.h"

using namespace tinyddp;
using namespace tinyddp::nn;

namespace {

using tinyddp::testing::TempDir;

// Linear(4, hidden) -> ReLU -> Linear(hidden, 3), trained with Adam (or SGD) under a cosine schedule.
struct Run {
  Sequential model;
  std::unique_ptr<Optimizer> optimizer;
  std::unique_ptr<LRScheduler> scheduler;

  explicit Run(uint64_t seed, int64_t hidden = 8, bool sgd = false) {
    Generator generator(seed);
    model.emplace<Linear>(4, hidden, generator);
    model.emplace<ReLU>();
    model.emplace<Linear>(hidden, 3, generator);
    if (sgd)
      optimizer = std::make_unique<SGD>(model.named_parameters(), 0.1, 0.9);
    else
      optimizer = std::make_unique<Adam>(model.named_parameters(), 0.01);
    scheduler = std::make_unique<CosineAnnealing>(*optimizer, 20);
  }

  void train_step(uint64_t batch_seed) {
    Generator generator(batch_seed);
    Tensor x = Tensor::empty({6, 4});
    fill_uniform(x, -1.f, 1.f, generator);
    Tensor labels = Tensor::from_vector<int64_t>({0, 1, 2, 2, 1, 0});
    CrossEntropyLoss loss;
    loss.forward(model.forward(x), labels);
    model.backward(loss.backward(), false);
    optimizer->step();
    scheduler->step();
    optimizer->zero_grad();
  }
};

// Everything a failed load must leave as it was: parameter values, optimizer state and counters,
// the lr and the scheduler's step.
struct Snapshot {
  std::vector<Tensor> tensors;
  int64_t step_count;
  double lr;
  int64_t last_step;

  explicit Snapshot(Run& run)
      : step_count(run.optimizer->step_count()), lr(run.optimizer->lr()), last_step(run.scheduler->last_step()) {
    for (Parameter* p : run.model.parameters()) tensors.push_back(p->value.clone());
    for (auto& [name, t] : run.optimizer->state_tensors()) tensors.push_back(t.clone());
  }
  bool operator==(const Snapshot& other) const {
    if (tensors.size() != other.tensors.size() || step_count != other.step_count || lr != other.lr ||
        last_step != other.last_step)
      return false;
    for (size_t i = 0; i < tensors.size(); ++i)
      if (!bitwise_equal(tensors[i], other.tensors[i])) return false;
    return true;
  }
};

// Requires load_checkpoint to fail with a message containing `problem` and to leave `run` unchanged.
void check_load_refused(const std::string& path, Run& run, const std::string& problem,
                        const CheckpointLoadOptions& options = {}) {
  const Snapshot before(run);
  try {
    load_checkpoint(path, run.model, run.optimizer.get(), run.scheduler.get(), options);
    FAIL_CHECK("loading should have failed with \"" << problem << "\"");
  } catch (const Error& e) {
    const std::string message = e.what();
    CHECK_MESSAGE(message.find(problem) != std::string::npos,
                  "the error \"" << message << "\" does not say \"" << problem << "\"");
    CHECK_MESSAGE(!e.hint().empty(), "the error \"" << message << "\" gives no hint");
  }
  CHECK_MESSAGE(Snapshot(run) == before, "a failed load changed the model, optimizer or scheduler (" << problem << ")");
}

// Rewrites a checkpoint with `edit` applied to its tensors and metadata (an independent way to make
// the broken files: the library's own writer, fed wrong contents).
template <typename Edit>
void rewrite(const std::string& from, const std::string& to, Edit&& edit) {
  SafetensorsFile file = load_safetensors(from);
  edit(file.tensors, file.metadata);
  save_safetensors(to, file.tensors, file.metadata);
}

}  // namespace

TEST_CASE("save_model writes PyTorch's state_dict names and shapes, and load_model reads them back") {
  TempDir dir;
  Run trained(1);
  trained.train_step(100);
  save_model(dir.file("model.safetensors"), trained.model);
  SafetensorsFile file = load_safetensors(dir.file("model.safetensors"));
  std::vector<std::string> names;
  for (const auto& [name, tensor] : file.tensors) names.push_back(name);
  CHECK(names == std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"});
  CHECK(file.get("0.weight").shape() == Shape{8, 4});  // [out, in], as torch.nn.Linear stores it
  CHECK(file.get("2.weight").shape() == Shape{3, 8});
  CHECK(file.get("2.bias").shape() == Shape{3});
  CHECK(file.metadata == Metadata{{"format", "pt"}});

  Run other(2);
  load_model(dir.file("model.safetensors"), other.model);
  for (const char* name : {"0.weight", "0.bias", "2.weight", "2.bias"})
    CHECK(bitwise_equal(other.model.parameter(name).value, trained.model.parameter(name).value));
}

TEST_CASE("load_model reads a state_dict PyTorch made, and the model then computes what PyTorch computed") {
  // test/fixtures/make_data.py: torch.nn.Sequential(Linear(4, 3), ReLU(), Linear(3, 2)), its
  // state_dict, an input batch and torch's output for it.
  Generator generator(0);
  Sequential model;
  model.emplace<Linear>(4, 3, generator);
  model.emplace<ReLU>();
  model.emplace<Linear>(3, 2, generator);
  load_model(testing::fixture("data_model.safetensors"), model);
  SafetensorsFile io = load_safetensors(testing::fixture("data_model_io.safetensors"));
  // Both forward passes are float32, each within mlp_forward_bound of the exact one: twice that apart.
  std::vector<double> bound = testing::mlp_forward_bound(model, io.get("input"));
  for (double& b : bound) b *= 2;
  testing::check_within(model.forward(io.get("input")).to_vector<float>(), io.get("output").to_vector<float>(), bound,
                        "Sequential output");
}

TEST_CASE("a checkpoint restores model, optimizer and scheduler exactly: resumed training matches uninterrupted") {
  TempDir dir;
  Run uninterrupted(7), first_half(7);
  for (uint64_t step = 0; step < 3; ++step) {
    uninterrupted.train_step(step);
    first_half.train_step(step);
  }
  CheckpointInfo info{2, 3, {{"best_loss", "0.5"}, {"note", "mid-run"}}};
  save_checkpoint(dir.file("ckpt.safetensors"), first_half.model, first_half.optimizer.get(),
                  first_half.scheduler.get(), info);

  Run resumed(99);  // other initial weights, fresh optimizer and scheduler
  CheckpointInfo loaded = load_checkpoint(dir.file("ckpt.safetensors"), resumed.model, resumed.optimizer.get(),
                                          resumed.scheduler.get());
  CHECK(loaded.epoch == 2);
  CHECK(loaded.step == 3);
  CHECK(loaded.extra == info.extra);
  CHECK(Snapshot(resumed) == Snapshot(first_half));
  CHECK(resumed.optimizer->step_count() == 3);
  CHECK(resumed.scheduler->last_step() == 3);

  for (uint64_t step = 3; step < 6; ++step) {
    uninterrupted.train_step(step);
    resumed.train_step(step);
  }
  CHECK(Snapshot(resumed) == Snapshot(uninterrupted));
}

TEST_CASE("a checkpoint's layout: optimizer state under optimizer.<name>, and the run's metadata") {
  TempDir dir;
  Run run(3);
  run.train_step(0);
  run.train_step(1);
  save_checkpoint(dir.file("ckpt.safetensors"), run.model, run.optimizer.get(), run.scheduler.get(),
                  {4, 250, {{"k", "v"}}});
  SafetensorsFile file = load_safetensors(dir.file("ckpt.safetensors"));
  CHECK(file.tensors.size() == 4 + 8);  // 4 parameters, exp_avg and exp_avg_sq for each
  CHECK(bitwise_equal(file.get("optimizer.exp_avg.0.weight"), run.optimizer->state_tensors()[0].second));
  CHECK(file.get("optimizer.exp_avg_sq.2.bias").shape() == Shape{3});
  const Metadata& m = file.metadata;
  CHECK(m.at("format") == "pt");
  CHECK(m.at("tinyddp.checkpoint") == "1");
  CHECK(m.at("tinyddp.optimizer") == "adam");
  CHECK(std::stod(m.at("tinyddp.optimizer.lr")) == run.optimizer->lr());
  CHECK(m.at("tinyddp.optimizer.initial_lr") == "0.01");
  CHECK(m.at("tinyddp.optimizer.step_count") == "2");
  CHECK(m.at("tinyddp.scheduler") == "cosine");
  CHECK(m.at("tinyddp.scheduler.last_step") == "2");
  CHECK(m.at("tinyddp.epoch") == "4");
  CHECK(m.at("tinyddp.step") == "250");
  CHECK(m.at("extra.k") == "v");

  // load_model takes the model out of a full checkpoint and skips the optimizer state.
  Run other(4);
  load_model(dir.file("ckpt.safetensors"), other.model);
  CHECK(bitwise_equal(other.model.parameter("2.bias").value, run.model.parameter("2.bias").value));
  // So does load_checkpoint without an optimizer or scheduler.
  Run model_only(5);
  CHECK(load_checkpoint(dir.file("ckpt.safetensors"), model_only.model, nullptr, nullptr).step == 250);
}

TEST_CASE("a checkpoint of the wrong model is refused, and nothing is changed") {
  TempDir dir;
  Run saved(1);
  saved.train_step(0);
  const std::string good = dir.file("good.safetensors");
  save_checkpoint(good, saved.model, saved.optimizer.get(), saved.scheduler.get());
  Run target(2);
  target.train_step(5);

  SUBCASE("wrong shape") {
    Run wide(3, 9);
    save_checkpoint(dir.file("wide.safetensors"), wide.model, wide.optimizer.get(), wide.scheduler.get());
    check_load_refused(dir.file("wide.safetensors"), target,
                       "tensor \"0.weight\" (model parameter) has shape [9, 4] in the file but [8, 4] here");
  }
  SUBCASE("wrong dtype, in the last tensor checked") {
    rewrite(good, dir.file("dtype.safetensors"), [](NamedTensors& tensors, Metadata&) {
      for (auto& [name, t] : tensors)
        if (name == "2.bias") t = Tensor::zeros({3}, DType::f64);
    });
    check_load_refused(dir.file("dtype.safetensors"), target,
                       "tensor \"2.bias\" (model parameter) is f64 in the file but f32 here");
  }
  SUBCASE("missing model tensor") {
    rewrite(good, dir.file("missing.safetensors"), [](NamedTensors& tensors, Metadata&) {
      std::erase_if(tensors, [](const auto& entry) { return entry.first == "2.bias"; });
    });
    check_load_refused(dir.file("missing.safetensors"), target,
                       "missing tensor \"2.bias\" (model parameter, expected f32[3])");
  }
  SUBCASE("missing optimizer state, the very last tensor checked") {
    rewrite(good, dir.file("missing_state.safetensors"), [](NamedTensors& tensors, Metadata&) {
      std::erase_if(tensors, [](const auto& entry) { return entry.first == "optimizer.exp_avg_sq.2.bias"; });
    });
    check_load_refused(dir.file("missing_state.safetensors"), target,
                       "missing tensor \"optimizer.exp_avg_sq.2.bias\" (optimizer state");
  }
  SUBCASE("extra tensor, refused unless allowed") {
    rewrite(good, dir.file("extra.safetensors"), [](NamedTensors& tensors, Metadata&) {
      tensors.emplace_back("4.weight", Tensor::zeros({2, 2}));
    });
    check_load_refused(dir.file("extra.safetensors"), target,
                       "1 unexpected tensor(s) that the model and optimizer do not have: \"4.weight\"");
    load_checkpoint(dir.file("extra.safetensors"), target.model, target.optimizer.get(), target.scheduler.get(),
                    {.allow_unexpected = true});
    CHECK(Snapshot(target) == Snapshot(saved));
  }
  SUBCASE("wrong optimizer kind") {
    Run sgd(2, 8, true);
    sgd.train_step(5);
    check_load_refused(good, sgd,
                       "the checkpoint holds the state of a \"adam\" optimizer but a \"sgd\" optimizer was given");
  }
  SUBCASE("wrong scheduler kind") {
    Run warm(2);
    warm.scheduler = std::make_unique<WarmUp>(*warm.optimizer, 5, 0.1);
    check_load_refused(good, warm, "holds a \"cosine\" scheduler but a \"warmup\" scheduler was given");
  }
  SUBCASE("a checkpoint saved without an optimizer, or a plain model file") {
    save_checkpoint(dir.file("no_optimizer.safetensors"), saved.model, nullptr, nullptr);
    check_load_refused(dir.file("no_optimizer.safetensors"), target, "saved without an optimizer");
    save_model(dir.file("plain.safetensors"), saved.model);
    check_load_refused(dir.file("plain.safetensors"), target, "is a plain model file");
  }
  SUBCASE("metadata that does not parse, or a newer format") {
    rewrite(good, dir.file("lr.safetensors"), [](NamedTensors&, Metadata& m) { m["tinyddp.optimizer.lr"] = "fast"; });
    check_load_refused(dir.file("lr.safetensors"), target,
                       "metadata \"tinyddp.optimizer.lr\" is \"fast\", not a number");
    rewrite(good, dir.file("epoch.safetensors"), [](NamedTensors&, Metadata& m) { m["tinyddp.epoch"] = "3x"; });
    check_load_refused(dir.file("epoch.safetensors"), target, "metadata \"tinyddp.epoch\" is \"3x\", not a number");
    rewrite(good, dir.file("steps.safetensors"),
            [](NamedTensors&, Metadata& m) { m.erase("tinyddp.optimizer.step_count"); });
    check_load_refused(dir.file("steps.safetensors"), target, "the metadata has no \"tinyddp.optimizer.step_count\"");
    rewrite(good, dir.file("v2.safetensors"), [](NamedTensors&, Metadata& m) { m["tinyddp.checkpoint"] = "2"; });
    check_load_refused(dir.file("v2.safetensors"), target, "checkpoint format version \"2\"");
  }
  SUBCASE("a damaged or absent file") {
    std::string bytes(std::filesystem::file_size(good), '\0');
    {
      std::FILE* in = std::fopen(good.c_str(), "rb");
      REQUIRE(in != nullptr);
      REQUIRE(std::fread(bytes.data(), 1, bytes.size(), in) == bytes.size());
      std::fclose(in);
    }
    std::FILE* out = std::fopen(dir.file("cut.safetensors").c_str(), "wb");
    REQUIRE(out != nullptr);
    std::fwrite(bytes.data(), 1, bytes.size() - 10, out);
    std::fclose(out);
    check_load_refused(dir.file("cut.safetensors"), target, "the file is truncated");
    check_load_refused(dir.file("absent.safetensors"), target, "cannot open");
  }
}

TEST_CASE("save_checkpoint refuses an empty extra key") {
  TempDir dir;
  Run run(1);
  CHECK_THROWS_WITH_AS(save_checkpoint(dir.file("x.safetensors"), run.model, nullptr, nullptr, {0, 0, {{"", "v"}}}),
                       doctest::Contains("extra metadata key is empty"), Error);
  CHECK_FALSE(std::filesystem::exists(dir.file("x.safetensors")));
}

TEST_CASE("a save killed mid-write never damages the checkpoint already on disk") {
  // A child process saves checkpoints in a loop, each with every value equal to its generation
  // number, and is SIGKILLed at a varying moment. Whatever the moment, the file must load, and hold
  // one whole generation: never a mixture, never a torn file.
  TempDir dir;
  const std::string path = dir.file("ckpt.safetensors");
  Run run(1, 256);  // 8 KB of weights and 16 KB of Adam state: a save takes several writes
  auto fill_all = [&](float value) {
    for (Parameter* p : run.model.parameters()) std::fill_n(p->value.data<float>(), p->value.numel(), value);
    for (auto& [name, t] : run.optimizer->state_tensors()) std::fill_n(t.data<float>(), t.numel(), value);
  };
  for (int round = 0; round < 6; ++round) {
    fill_all(0.f);
    save_checkpoint(path, run.model, run.optimizer.get(), run.scheduler.get());  // generation 0 again
    pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      // The child: save generation after generation (bounded, in case the parent is gone). It must
      // never return into the test runner, whatever happens.
      try {
        for (int generation = 1; generation <= 100000; ++generation) {
          fill_all(float(generation));
          save_checkpoint(path, run.model, run.optimizer.get(), run.scheduler.get(), {generation, generation, {}});
        }
      } catch (...) {
        ::_exit(1);
      }
      ::_exit(0);
    }
    // Should a check below throw, the child is killed and reaped all the same.
    struct KillOnExit {
      pid_t pid;
      ~KillOnExit() {
        if (pid > 0 && ::kill(pid, SIGKILL) == 0) ::waitpid(pid, nullptr, 0);
      }
    } guard{child};
    // Read the file while the child rewrites it (a reader must always see one whole file) until the
    // child has replaced it at least once in this round, then let it run a little longer and kill it.
    auto generation_on_disk = [&] {
      Run reader(4, 256);
      return load_checkpoint(path, reader.model, reader.optimizer.get(), reader.scheduler.get()).epoch;
    };
    int64_t seen = 0;
    for (int tries = 0; tries < 10000 && seen == 0; ++tries) {  // at most ~10 s
      seen = generation_on_disk();
      if (seen == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(round));
    REQUIRE(::kill(child, SIGKILL) == 0);
    int status = 0;
    pid_t waited = 0;
    for (int tries = 0; tries < 1000 && waited == 0; ++tries) {  // at most ~10 s
      waited = ::waitpid(child, &status, WNOHANG);
      if (waited == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    REQUIRE_MESSAGE(waited == child, "the killed child was not reaped within 10 s");
    guard.pid = 0;
    REQUIRE_MESSAGE(seen > 0, "the child never replaced the checkpoint within 10 s");

    Run loaded(2, 256);
    CheckpointInfo info = load_checkpoint(path, loaded.model, loaded.optimizer.get(), loaded.scheduler.get());
    const float generation = float(info.epoch);
    bool uniform = true;
    for (Parameter* p : loaded.model.parameters())
      for (float v : p->value.to_vector<float>()) uniform = uniform && v == generation;
    for (auto& [name, t] : loaded.optimizer->state_tensors())
      for (float v : t.to_vector<float>()) uniform = uniform && v == generation;
    CHECK(info.epoch >= seen);
    CHECK_MESSAGE(uniform,
                  "round " << round << ": the checkpoint of generation " << generation << " holds other values");
  }
  // The killed saves may have left temporary files; a new save and load are unaffected by them.
  fill_all(-1.f);
  save_checkpoint(path, run.model, run.optimizer.get(), run.scheduler.get(), {-1, -1, {}});
  Run last(3, 256);
  CHECK(load_checkpoint(path, last.model, last.optimizer.get(), last.scheduler.get()).epoch == -1);
  CHECK(last.model.parameter("2.bias").value.item<float>(0) == -1.f);
}

namespace {

using Managed = WithAddOns<testing::MlpTrainer, StateManager>;

// A run of StateManager with checkpoints in `dir`, `epochs` epochs in all (counting resumed ones),
// train loss only (so the best epoch is the one with the lowest training loss).
struct ManagedRun {
  testing::Setup setup;
  DataLoader loader{testing::three_class_data(60, 11), {.batch_size = 16, .shuffle = true, .seed = 3}};
  Managed trainer;
  ManagedRun(const std::string& dir, uint64_t model_seed = 7)
      : setup(model_seed),
        trainer(*setup.model, Device::cpu(), *setup.optimizer, setup.scheduler.get(), {.log_bar = false}) {
    trainer.set_checkpoint_dir(dir);
  }
};

int64_t best_epoch_in(const std::string& last) {
  return std::stoll(load_safetensors(last).metadata.at("extra.trainer.best_epoch"));
}

std::vector<float> flat(const NamedTensors& tensors) {
  std::vector<float> out;
  for (const auto& [name, t] : tensors) {
    std::vector<float> v = t.to_vector<float>();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

}  // namespace

TEST_CASE("StateManager: a crash between writing last and best is repaired on resume, best file included") {
  TempDir dir;
  const std::string ck = dir.file("ck");
  ManagedRun straight(dir.file("straight"));
  straight.trainer.run(4, straight.loader);

  std::string best_after_epoch_1;
  {
    ManagedRun first(ck);
    first.trainer.run(1, first.loader);
    best_after_epoch_1 = ck + "/best_epoch_1.safetensors";
    std::filesystem::copy_file(ck + "/best.safetensors", best_after_epoch_1);
    first.trainer.run(2, first.loader);
    REQUIRE(*first.trainer.best_epoch() == 1);  // the loss fell: epoch 2 wrote last, then best
  }
  // The process died after last.safetensors (epoch 2, "best is epoch 2") and before best.safetensors.
  std::filesystem::rename(best_after_epoch_1, ck + "/best.safetensors");
  REQUIRE(checkpoint_epochs_done(ck + "/best.safetensors") == 1);

  ManagedRun resumed(ck, /*model_seed=*/99);
  resumed.trainer.run(2, resumed.loader);  // nothing left to train: only the resume happens
  CHECK(*resumed.trainer.resumed_from() == 2);
  // The best weights are the last epoch's, and rank 0 rewrote best.safetensors with them.
  CHECK(checkpoint_epochs_done(ck + "/best.safetensors") == 2);
  CHECK(flat(resumed.trainer.best_weights()) == testing::flat_weights(resumed.trainer.model()));
  CHECK(flat(load_model_tensors(ck + "/best.safetensors", resumed.trainer.model())) ==
        testing::flat_weights(resumed.trainer.model()));

  resumed.trainer.run(4, resumed.loader);
  CHECK(testing::flat_weights(resumed.trainer.model()) == testing::flat_weights(straight.trainer.model()));
  CHECK(resumed.trainer.best_epoch() == straight.trainer.best_epoch());
  CHECK(flat(resumed.trainer.best_weights()) == flat(straight.trainer.best_weights()));
  CHECK(checkpoint_epochs_done(ck + "/best.safetensors") == best_epoch_in(ck + "/last.safetensors") + 1);
}

TEST_CASE("StateManager: a best file that does not match last is refused; leftover temporaries are removed") {
  TempDir dir;
  const std::string ck = dir.file("ck");
  {
    ManagedRun first(ck);
    first.trainer.run(3, first.loader);
  }
  // last says the best epoch was the first one; best.safetensors holds a later one.
  rewrite(ck + "/last.safetensors", ck + "/last.safetensors",
          [](NamedTensors&, Metadata& metadata) { metadata["extra.trainer.best_epoch"] = "0"; });
  REQUIRE(checkpoint_epochs_done(ck + "/best.safetensors") != 1);
  { std::ofstream(ck + "/last.safetensors.tmp.12345.0") << "half a file"; }
  { std::ofstream(ck + "/notes.safetensors.tmp.1") << "not ours"; }
  ManagedRun resumed(ck);
  CHECK_THROWS_WITH_AS(resumed.trainer.run(4, resumed.loader),
                       doctest::Contains("the two files come from different runs; remove best.safetensors"), Error);
  CHECK_FALSE(std::filesystem::exists(ck + "/last.safetensors.tmp.12345.0"));
  CHECK(std::filesystem::exists(ck + "/notes.safetensors.tmp.1"));
}

TEST_CASE(
    "StateManager: killed at random moments while it checkpoints every epoch, last and best always load and agree") {
  TINYDDP_SKIP_UNDER_TSAN();
  TempDir dir;
  const std::string ck = dir.file("ck");
  for (int round = 0; round < 8; ++round) {
    testing::Child child = testing::spawn_child([&](std::string& report) {
      ManagedRun run(ck);
      run.trainer.run(100000, run.loader);  // killed long before the end
      report = "the run ended";
      return 1;
    });
    testing::ChildGuard guard{child};
    // Until it has written a checkpoint in this round (it keeps writing one every few ms), and a
    // moment more that varies with the round.
    auto deadline = testing::Clock::now() + std::chrono::seconds(20);
    int64_t before = checkpoint_exists(ck + "/last.safetensors") ? checkpoint_epochs_done(ck + "/last.safetensors") : 0;
    while (testing::Clock::now() < deadline && (!checkpoint_exists(ck + "/last.safetensors") ||
                                                checkpoint_epochs_done(ck + "/last.safetensors") <= before + 1))
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::microseconds(300 * round));
    REQUIRE(::kill(child.pid, SIGKILL) == 0);
    testing::ChildOutcome outcome = testing::finish_child(child, std::chrono::seconds(10));
    REQUIRE_MESSAGE(outcome.signal == SIGKILL, outcome.describe());

    // Both files load, and best is the epoch last names as best -- or one best behind, when the kill
    // fell between the two writes and last's best epoch is its own last epoch (repaired on resume).
    ManagedRun check(ck, 5);
    const std::string last = ck + "/last.safetensors", best = ck + "/best.safetensors";
    const int64_t epochs = load_training_state(last, check.trainer);
    const int64_t best_epoch = best_epoch_in(last);
    const int64_t in_best = checkpoint_epochs_done(best);
    CHECK(load_model_tensors(best, check.trainer.model()).size() == 4);
    CHECK_MESSAGE((in_best == best_epoch + 1 || (best_epoch + 1 == epochs && in_best <= epochs)), "round ", round,
                  ": last holds ", epochs, " epochs, best epoch ", best_epoch + 1, "; best holds ", in_best);
  }
  // Resuming repairs whatever the last kill left.
  ManagedRun resumed(ck);
  int64_t epochs = checkpoint_epochs_done(ck + "/last.safetensors");
  resumed.trainer.run(epochs, resumed.loader);
  CHECK(checkpoint_epochs_done(ck + "/best.safetensors") == best_epoch_in(ck + "/last.safetensors") + 1);
}
