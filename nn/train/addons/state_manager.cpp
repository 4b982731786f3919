#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <vector>

#include "tinyddp/core/error.h"
#include "tinyddp/core/fault_injection.h"
#include "tinyddp/core/output_path.h"
#include "tinyddp/core/process.h"
#include "tinyddp/nn/train/addons/state_manager.h"
#include "tinyddp/nn/train/checkpoint.h"

namespace tinyddp::nn {

namespace {

// The size a training-state file will have, near enough: the one it replaces, or its tensors' bytes.
uint64_t expected_file_size(const std::string& path, Trainer& trainer) {
  std::error_code error;
  uint64_t size = std::filesystem::file_size(path, error);
  if (!error && size > 0) return size;
  uint64_t bytes = 0;
  for (const NamedParameter& p : trainer.model().named_parameters()) bytes += p.parameter->value.nbytes();
  for (auto& [name, tensor] : trainer.optimizer().state_tensors()) bytes += tensor.nbytes();
  return bytes;
}

}  // namespace

void save_training_state(const std::string& path, Trainer& trainer, bool with_history) {
  // The checkpoint_write fault: die with the new file half written, the old one still in place.
  if (fault::armed() && fault::due("checkpoint_write"))
    fault::kill_when_file_exceeds(std::max<uint64_t>(1, expected_file_size(path, trainer) / 2), "checkpoint_write");
  CheckpointInfo info;
  info.epoch = trainer.epochs_done();
  info.step = trainer.global_step();
  info.extra = trainer.progress_metadata(with_history);
  save_checkpoint(path, trainer.model(), &trainer.optimizer(), trainer.scheduler(), info);
}

int64_t load_training_state(const std::string& path, Trainer& trainer) {
  // load_checkpoint validates the whole file before it changes anything, so a damaged checkpoint
  // throws and leaves the trainer as it was.
  CheckpointInfo info = load_checkpoint(path, trainer.model(), &trainer.optimizer(), trainer.scheduler());
  trainer.restore_progress(info.extra, info.epoch);
  return info.epoch;
}

NamedTensors load_model_tensors(const std::string& path, Module& model) {
  SafetensorsFile file = load_safetensors(path);
  NamedTensors out;
  for (const NamedParameter& p : model.named_parameters()) {
    const Tensor& saved = file.get(p.name);
    TINYDDP_CHECK(saved.shape() == p.parameter->value.shape() && saved.dtype() == p.parameter->value.dtype(), path,
                  ": ", p.name, " is ", saved.describe(), " but the model's is ", p.parameter->value.describe(),
                  hint("the file was saved from a different model"));
    out.emplace_back(p.name, saved);
  }
  return out;
}

void prepare_checkpoint_dir(const std::string& directory) {
  std::error_code error;
  // create_directories is safe when several ranks race to create the same path: the losers find it
  // existing, which is not an error.
  std::filesystem::create_directories(directory, error);
  std::error_code not_there;
  TINYDDP_CHECK(std::filesystem::is_directory(directory) || !std::filesystem::exists(directory, not_there),
                "StateManager: the checkpoint directory ", directory, " is a file, not a directory",
                hint("give a directory (it is created when missing), or move the file away"));
  TINYDDP_CHECK(std::filesystem::is_directory(directory), "StateManager: cannot create the checkpoint directory ",
                directory, (error ? ": " + error.message() : std::string()),
                hint("choose a path under a writable directory"));
  if (std::optional<Unwritable> unwritable = why_unwritable(directory))
    TINYDDP_FAIL("StateManager: the checkpoint directory ", directory, " ", unwritable->why, hint(unwritable->hint));
}

bool checkpoint_exists(const std::string& path) {
  struct stat info;
  return stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode);
}

int64_t checkpoint_epochs_done(const std::string& path) {
  SafetensorsFile file = load_safetensors(path);
  auto it = file.metadata.find("tinyddp.epoch");
  TINYDDP_CHECK(it != file.metadata.end(), path, " has no tinyddp.epoch metadata",
                hint("it is not a training checkpoint (save_training_state writes those)"));
  try {
    size_t used = 0;
    int64_t epochs = std::stoll(it->second, &used);
    if (used == it->second.size() && epochs >= 0) return epochs;
  } catch (const std::exception&) {}
  TINYDDP_FAIL(path, ": tinyddp.epoch is \"", it->second, "\", not a number of epochs",
               hint("the file was edited or damaged"));
}

void remove_stale_temporaries(const std::string& directory) {
  std::error_code error;
  std::vector<std::filesystem::path> stale;
  for (const auto& entry : std::filesystem::directory_iterator(directory, error)) {
    const std::string name = entry.path().filename().string();
    // Only what save_safetensors names its temporaries after our two files: nothing of the user's.
    for (const char* ours : {"last.safetensors.tmp.", "best.safetensors.tmp.", "history.jsonl.tmp."})
      if (name.rfind(ours, 0) == 0) stale.push_back(entry.path());
  }
  for (const auto& path : stale) std::filesystem::remove(path, error);
}

void remove_dead_writers_temporaries(const std::string& directory) {
  std::error_code error;
  std::vector<std::filesystem::path> stale;
  for (const auto& entry : std::filesystem::directory_iterator(directory, error)) {
    const std::string name = entry.path().filename().string();
    for (const std::string ours : {"last.safetensors.tmp.", "best.safetensors.tmp.", "history.jsonl.tmp."}) {
      if (name.rfind(ours, 0) != 0) continue;
      // <file>.tmp.<pid>.<n>: save_safetensors' temporary, written by process <pid>.
      const std::string rest = name.substr(ours.size());
      const size_t dot = rest.find('.');
      const long pid = dot == std::string::npos ? 0 : std::atol(rest.substr(0, dot).c_str());
      if (pid > 0 && !process_alive(int(pid))) stale.push_back(entry.path());
    }
  }
  for (const auto& path : stale) std::filesystem::remove(path, error);
}

std::string resume_hint_for(const std::string& last_checkpoint) {
  if (!checkpoint_exists(last_checkpoint)) return "";
  try {
    const int64_t done = checkpoint_epochs_done(last_checkpoint);
    return "run it again to resume from " + last_checkpoint + " (" + std::to_string(done) +
           (done == 1 ? " epoch" : " epochs") + " done)";
  } catch (const std::exception&) {
    return "";  // not a checkpoint it could resume from: no promise
  }
}

void check_same_resume_point(const std::vector<double>& sums, int64_t epochs_done, int64_t step,
                             const std::string& path) {
  TINYDDP_CHECK(sums.size() == 5 && sums[0] >= 1, "StateManager: the resume check got ", sums.size(), " sums",
                hint("this is a bug in tinyddp"));
  const double n = sums[0];
  // Cauchy-Schwarz: sum(x)^2 <= n * sum(x^2), with equality only when every x is the same. The values
  // are integers far below 2^26, so their squares and sums are exact in a double.
  const bool same_epoch = sums[1] * sums[1] == n * sums[2], same_step = sums[3] * sums[3] == n * sums[4];
  TINYDDP_CHECK(same_epoch && same_step, "StateManager: the ", int64_t(n),
                " ranks did not resume from the same point (", "this rank: ", epochs_done, " epochs, step ", step,
                "; the mean over the ranks: ", sums[1] / n, " epochs, step ", sums[3] / n, ") after reading ", path,
                hint("every rank must see the same checkpoint directory (a shared file system, or one machine)"));
}

// One grad-ready hook per parameter, run after DDP's own (the hooks run in registration order).
struct TrainingFaultPoints::GradReadyHook {
  TrainingFaultPoints* owner;
  void operator()(Parameter&) const {
    size_t ready = ++owner->ready_;
    if (ready == 1) fault::point("backward");
    if (ready == owner->parameters_) fault::point("allreduce");
  }
};

TrainingFaultPoints::TrainingFaultPoints(Module& model) : model_(model) {
  for (const NamedParameter& p : model_.named_parameters()) {
    p.parameter->grad_ready_hooks.push_back(GradReadyHook{this});
    ++parameters_;
  }
}

TrainingFaultPoints::~TrainingFaultPoints() {
  for (const NamedParameter& p : model_.named_parameters())
    std::erase_if(p.parameter->grad_ready_hooks, [this](const std::function<void(Parameter&)>& hook) {
      const GradReadyHook* mine = hook.target<GradReadyHook>();
      return mine != nullptr && mine->owner == this;
    });
}

void TrainingFaultPoints::begin_step() {
  ready_ = 0;
  fault::point("forward");
}

}  // namespace tinyddp::nn
