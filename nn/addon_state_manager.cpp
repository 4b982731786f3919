#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "nn/addons/state_manager.h"
#include "nn/checkpoint.h"

namespace tinyddp::nn {

void save_training_state(const std::string& path, Trainer& trainer) {
  CheckpointInfo info;
  info.epoch = trainer.epochs_done();
  info.step = trainer.global_step();
  info.extra = trainer.progress_metadata();
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
                  "; hint: the file was saved from a different model");
    out.emplace_back(p.name, saved);
  }
  return out;
}

void prepare_checkpoint_dir(const std::string& directory) {
  std::error_code error;
  // create_directories is safe when several ranks race to create the same path: the losers find it
  // existing, which is not an error.
  std::filesystem::create_directories(directory, error);
  TINYDDP_CHECK(std::filesystem::is_directory(directory), "StateManager: cannot create the checkpoint directory ",
                directory, (error ? ": " + error.message() : std::string()),
                "; hint: choose a path under a writable directory");
  TINYDDP_CHECK(access(directory.c_str(), W_OK) == 0, "StateManager: the checkpoint directory ", directory,
                " is not writable: ", std::strerror(errno), "; hint: choose another directory or fix its permissions");
}

bool checkpoint_exists(const std::string& path) {
  struct stat info;
  return stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode);
}

}  // namespace tinyddp::nn
