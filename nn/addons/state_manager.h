// StateManager: checkpoints every epoch and at the best loss, and resumes from them.
//
//   using MyTrainer = nn::WithAddOns<DummyTrainer, nn::StateManager>;
//   MyTrainer trainer(model, devices, optimizer, &scheduler);
//   trainer.set_checkpoint_dir("runs/dummy");
//   trainer.run(10, loader);    // killed in epoch 7? run the same command again: epochs 7..9 follow
//
// Files, in safetensors (nn/checkpoint.h; PyTorch reads the model part):
//   <dir>/last.safetensors   after every epoch: the model, the optimizer's state (Adam's moments and
//                            step count), the scheduler's step, the epochs done and the history
//   <dir>/best.safetensors   the same, written after each epoch whose loss is the lowest so far (the
//                            validation loss when there is a validation set)
// Only rank 0 writes, so N ranks do not race on one file (their replicas are identical anyway), and
// each write is atomic (a temporary file, fsync, rename): a crash mid-save leaves the previous
// checkpoint intact, never half of one.
//
// Resuming happens when run() starts and <dir>/last.safetensors exists: every rank loads it (the
// directory must be visible to all of them, as it is for ranks of one machine or on a shared file
// system), restoring the weights, the optimizer and scheduler, the history and the best weights, so
// the resumed run computes exactly what the uninterrupted run would have.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <type_traits>

#include "nn/trainer.h"

namespace tinyddp::nn {

// The training state of `trainer` (model, optimizer, scheduler, epochs done, history, best loss) in
// one checkpoint file, and back. MultiDevice uses the same pair to hand rank 0's result to the parent.
void save_training_state(const std::string& path, Trainer& trainer);
// Restores everything save_training_state wrote; returns the number of epochs done.
int64_t load_training_state(const std::string& path, Trainer& trainer);
// The model tensors of a checkpoint file (what best_weights() holds), read without touching the model.
NamedTensors load_model_tensors(const std::string& path, Module& model);
// Creates `directory` and its parents when missing (every rank may call it at once), and checks that
// it is a writable directory.
void prepare_checkpoint_dir(const std::string& directory);
bool checkpoint_exists(const std::string& path);

template <class Base>
class StateManager : public Base {
  static_assert(std::is_base_of_v<Trainer, Base>, "StateManager<Base>: Base must derive from nn::Trainer");

 public:
  using Base::Base;

  // Turns checkpointing on (an empty directory turns it off). With resume, a run() that finds
  // <dir>/last.safetensors continues from it.
  void set_checkpoint_dir(std::string directory, bool resume = true) {
    directory_ = std::move(directory);
    resume_ = resume;
  }
  const std::string& checkpoint_dir() const { return directory_; }
  std::string last_checkpoint_path() const { return directory_ + "/last.safetensors"; }
  std::string best_checkpoint_path() const { return directory_ + "/best.safetensors"; }
  // The epochs done in the checkpoint the last run() resumed from (nullopt: it started fresh).
  std::optional<int64_t> resumed_from() const { return resumed_from_; }

 protected:
  void on_run_begin(int64_t n_epoch) override {
    Base::on_run_begin(n_epoch);
    resumed_from_.reset();
    if (directory_.empty()) return;
    prepare_checkpoint_dir(directory_);
    if (resume_ && checkpoint_exists(last_checkpoint_path())) {
      resumed_from_ = load_training_state(last_checkpoint_path(), *this);
      if (checkpoint_exists(best_checkpoint_path()))
        this->set_best_weights(load_model_tensors(best_checkpoint_path(), this->model()));
      // Said where the progress bar speaks (stderr, rank 0), so nobody wonders why epoch 1 never shows.
      if (this->options().log_bar && this->is_rank_zero())
        std::fprintf(stderr, "resuming from %s: %lld of %lld epochs done\n", last_checkpoint_path().c_str(),
                     (long long)*resumed_from_, (long long)n_epoch);
    }
  }

  void on_epoch_end(const EpochRecord& record) override {
    Base::on_epoch_end(record);
    if (directory_.empty() || !this->is_rank_zero()) return;
    // best first: if the process dies between the two writes, last.safetensors (what resume reads)
    // is still the previous epoch's, and that epoch is simply run again.
    if (this->best_epoch() && *this->best_epoch() == record.epoch) save_training_state(best_checkpoint_path(), *this);
    save_training_state(last_checkpoint_path(), *this);
  }

 private:
  std::string directory_;
  bool resume_ = true;
  std::optional<int64_t> resumed_from_;
};

}  // namespace tinyddp::nn
