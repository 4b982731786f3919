// StateManager: checkpoints every epoch and at the best loss, and resumes from them.
//
//   using MyTrainer = nn::WithAddOns<DummyTrainer, nn::StateManager>;
//   MyTrainer trainer(model, devices, optimizer, &scheduler);
//   trainer.set_checkpoint_dir("runs/dummy");
//   trainer.run(10, loader);    // killed in epoch 7? run the same command again: epochs 7..9 follow
//
// Files, in safetensors (nn/train/checkpoint.h; PyTorch reads the model part):
//   <dir>/last.safetensors   after every epoch: the model, the optimizer's state (Adam's moments and
//                            step count), the scheduler's step, the epochs done and the best loss; one
//                            size however many epochs have run
//   <dir>/best.safetensors   the same, written after each epoch whose loss is the lowest so far (the
//                            validation loss when there is a validation set)
//   <dir>/history.jsonl      the history, one line per epoch, appended (history_file.h)
//   <dir>/lock               while a job runs: who holds the directory (checkpoint_dir_lock.h); a
//                            second job started into it fails naming that one
// Only rank 0 writes, so N ranks do not race on one file (their replicas are identical anyway), and
// each write is atomic (a temporary file, fsync, rename, fsync of the directory): a crash mid-save
// leaves the previous checkpoint intact, never half of one. last.safetensors is written before
// best.safetensors, so last always says which epoch was best, and a crash between the two writes
// is repaired on resume (the best weights are then the last epoch's, which last holds).
//
// Resuming happens when run() starts and <dir>/last.safetensors exists: every rank loads it (the
// directory must be visible to all of them, as it is for ranks of one machine or on a shared file
// system), restoring the weights, the optimizer and scheduler, the history and the best weights, so
// the resumed run computes exactly what the uninterrupted run would have. The ranks then check, in
// one small all-reduce, that they all resumed from the same epoch and step: a rank that saw another
// file (a directory that is not shared) stops the job with an error instead of training on a
// different model.
//
// Under tinyddp-run --max-restarts (comm/launch/launcher.h) this is what makes a crash cost at most one
// epoch: a worker dies, the launcher stops the rest and starts the group again, and the new group
// resumes here from the last complete epoch. The fault points of core/fault_injection.h that sit
// inside a training step (forward, backward, allreduce) are armed here too, in tests only
// (TINYDDP_FAULT): this add-on is where a run is made to survive faults, so it is where they are made.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "tinyddp/core/fault_injection.h"
#include "tinyddp/core/log.h"
#include "tinyddp/nn/train/addons/checkpoint_dir_lock.h"
#include "tinyddp/nn/train/addons/history_file.h"
#include "tinyddp/nn/train/trainer.h"

namespace tinyddp::nn {

// The training state of `trainer` (model, optimizer, scheduler, epochs done, history, best loss) in
// one checkpoint file, and back. MultiDevice uses the same pair to hand rank 0's result to the parent.
// Without the history (StateManager keeps it in history.jsonl), the file's size does not grow with
// the epochs.
void save_training_state(const std::string& path, Trainer& trainer, bool with_history = true);
// Restores everything save_training_state wrote; returns the number of epochs done.
int64_t load_training_state(const std::string& path, Trainer& trainer);
// The model tensors of a checkpoint file (what best_weights() holds), read without touching the model.
NamedTensors load_model_tensors(const std::string& path, Module& model);
// Creates `directory` and its parents when missing (every rank may call it at once), and checks that
// it is a writable directory.
void prepare_checkpoint_dir(const std::string& directory);
bool checkpoint_exists(const std::string& path);
// The epochs done that a training-state file records (its tinyddp.epoch), read without a model.
int64_t checkpoint_epochs_done(const std::string& path);
// Removes the temporary files that writers killed mid-save left in `directory` (<name>.tmp.<pid>.<n>):
// they are never read, but a job restarted many times would pile them up.
void remove_stale_temporaries(const std::string& directory);
// The same, but only those whose writer (the <pid> in the name) no longer runs on this host: what a
// MultiDevice spawner removes once its workers are gone, leaving another live writer's alone.
void remove_dead_writers_temporaries(const std::string& directory);
// "run it again to resume from <dir>/last.safetensors (7 epochs done)", or "" when there is no such file.
std::string resume_hint_for(const std::string& last_checkpoint);
// Every rank's (epochs done, step) after resuming, summed over the ranks as [1, e, e*e, s, s*s]:
// they are all equal exactly when sum(e)^2 == n * sum(e*e), and the same for s. Throws when not.
void check_same_resume_point(const std::vector<double>& sums, int64_t epochs_done, int64_t step,
                             const std::string& path);

// The fault points of a training step that an add-on can reach (core/fault_injection.h): "backward"
// when the first gradient of a backward pass is finished, "allreduce" when the last one is -- its
// grad-ready hooks run after DDP's, so the last bucket's all-reduce has just been launched. Grad-ready
// hooks on the model's parameters, removed again by the destructor.
class TrainingFaultPoints {
 public:
  explicit TrainingFaultPoints(Module& model);
  ~TrainingFaultPoints();
  TrainingFaultPoints(const TrainingFaultPoints&) = delete;
  TrainingFaultPoints& operator=(const TrainingFaultPoints&) = delete;
  // A training step starts: passes "forward" and starts counting this step's gradients afresh.
  void begin_step();

 private:
  struct GradReadyHook;
  Module& model_;
  size_t parameters_ = 0;
  size_t ready_ = 0;
};

template <class Base>
class StateManager : public Base {
  static_assert(std::is_base_of_v<Trainer, Base>, "StateManager<Base>: Base must derive from nn::Trainer");

 public:
  using Base::Base;

  // Turns checkpointing on (an empty directory turns it off). With resume (the default), a run() that
  // finds <dir>/last.safetensors continues from it, and says so: "resuming from <dir>/last.safetensors:
  // 7 of 10 epochs done" (or that all of them are, when the run has nothing left to train). With
  // resume = false, run() starts from the model as it is and overwrites the directory's checkpoints.
  void set_checkpoint_dir(std::string directory, bool resume = true) {
    directory_ = std::move(directory);
    resume_ = resume;
  }
  const std::string& checkpoint_dir() const { return directory_; }
  std::string last_checkpoint_path() const { return directory_ + "/last.safetensors"; }
  std::string best_checkpoint_path() const { return directory_ + "/best.safetensors"; }
  std::string history_path() const { return directory_ + "/history.jsonl"; }
  // The epochs done in the checkpoint the last run() resumed from (nullopt: it started fresh).
  std::optional<int64_t> resumed_from() const { return resumed_from_; }

  // The process that writes the checkpoints holds the directory's lock while it runs (a second job
  // into the same directory fails naming this one: checkpoint_dir_lock.h); it lets go however run() ends.
  void run(int64_t n_epoch, DataLoader& loader, DataLoader* valid_loader = nullptr) override {
    try {
      Base::run(n_epoch, loader, valid_loader);
    } catch (...) {
      lock_.reset();
      throw;
    }
    lock_.reset();
  }

 protected:
  void on_run_begin(int64_t n_epoch) override {
    Base::on_run_begin(n_epoch);
    resumed_from_.reset();
    if (fault::armed()) faults_ = std::make_unique<TrainingFaultPoints>(this->model());
    if (directory_.empty()) return;
    prepare_checkpoint_dir(directory_);
    // Only rank 0 writes, and no write happens before every rank is past this point (rank 0 cannot
    // end an epoch alone); with the lock held no other job writes here either, so the temporaries
    // found now are dead writers' leftovers.
    if (this->is_rank_zero()) {
      lock_ = std::make_unique<CheckpointDirLock>(directory_);
      remove_stale_temporaries(directory_);
    }
    if (resume_ && checkpoint_exists(last_checkpoint_path())) {
      resumed_from_ = load_training_state(last_checkpoint_path(), *this);
      resume_history();
      restore_best_weights();
      // Said whether or not a progress bar is drawn (by rank 0), so nobody wonders why epoch 1 never
      // shows, or why a second run of the same command trains nothing.
      if (this->is_rank_zero()) tell_resumed(n_epoch);
    }
    // The file holds exactly the history the run goes on from (none, for a fresh start): a line of an
    // epoch the checkpoint does not hold, or half a line, goes now, before this run appends.
    if (this->is_rank_zero()) write_history(history_path(), this->history());
    const double e = double(this->epochs_done()), s = double(this->global_step());
    std::vector<double> sums{1, e, e * e, s, s * s};
    this->all_reduce_sum(sums);
    check_same_resume_point(sums, this->epochs_done(), this->global_step(), last_checkpoint_path());
  }

  bool saves_state_each_epoch() const override { return !directory_.empty() || Base::saves_state_each_epoch(); }

  void on_epoch_end(const EpochRecord& record) override {
    Base::on_epoch_end(record);
    if (directory_.empty() || !this->is_rank_zero()) return;
    // The history line first, then last: a line ahead of the checkpoint is dropped on resuming
    // (history_file.h). last before best: it records which epoch was best. If the process dies
    // between the two writes, restore_best_weights() finds best.safetensors one best behind and
    // repairs it.
    append_history_line(history_path(), record);
    save_training_state(last_checkpoint_path(), *this, /*with_history=*/false);
    if (this->best_epoch() && *this->best_epoch() == record.epoch)
      save_training_state(best_checkpoint_path(), *this, /*with_history=*/false);
  }

  void on_run_end() override {
    faults_.reset();
    Base::on_run_end();
  }

  void on_workers_ended() override {
    Base::on_workers_ended();
    if (directory_.empty()) return;
    remove_dead_writers_temporaries(directory_);
    remove_stale_lock(directory_);
  }

  std::string resume_hint() const override {
    std::string hint = directory_.empty() ? std::string() : resume_hint_for(last_checkpoint_path());
    return hint.empty() ? Base::resume_hint() : hint;
  }

 public:
  StepOutput train_step(const Batch& batch) override {
    if (faults_) faults_->begin_step();
    return Base::train_step(batch);
  }

 private:
  void tell_resumed(int64_t n_epoch) const {
    const long long done = (long long)*resumed_from_;
    std::string line = "resuming from " + last_checkpoint_path() + ": " + std::to_string(done) + " of " +
                       std::to_string(n_epoch) + " epochs done";
    if (done >= n_epoch)
      line +=
          ", nothing left to train; hint: pass more epochs, another directory, or set_checkpoint_dir(dir, "
          "/*resume=*/false) to start over";
    log_line(LogLevel::info, "checkpoint", line);
  }

  // The history after resuming: from history.jsonl; from the checkpoint itself when it was written
  // with its history inside (by an earlier version) and the file holds fewer records.
  void resume_history() {
    std::vector<EpochRecord> records = read_history(history_path(), this->epochs_done());
    if (records.size() < this->history().size()) return;
    if (int64_t(records.size()) < this->epochs_done() && this->is_rank_zero())
      log_line(LogLevel::warn, "checkpoint",
               history_path() + " holds the records of " + std::to_string(records.size()) + " of the " +
                   std::to_string(this->epochs_done()) + " epochs done; the history goes on from those");
    this->restore_history(std::move(records));
  }

  // The best weights after resuming: from best.safetensors when it holds the epoch that last says was
  // best; from the weights just loaded when the best epoch is the last one done (a crash between the
  // two writes leaves best.safetensors behind, and rank 0 rewrites it).
  void restore_best_weights() {
    const std::optional<int64_t> best = this->best_epoch();
    if (!best) return;
    if (*best + 1 == this->epochs_done()) {
      NamedTensors weights;
      for (const NamedParameter& p : this->model().named_parameters())
        weights.emplace_back(p.name, p.parameter->value.to(Device::cpu()).clone());
      this->set_best_weights(std::move(weights));
      if (this->is_rank_zero() && (!checkpoint_exists(best_checkpoint_path()) ||
                                   checkpoint_epochs_done(best_checkpoint_path()) != this->epochs_done()))
        save_training_state(best_checkpoint_path(), *this);
      return;
    }
    if (!checkpoint_exists(best_checkpoint_path())) return;
    const int64_t in_file = checkpoint_epochs_done(best_checkpoint_path());
    TINYDDP_CHECK(in_file == *best + 1, best_checkpoint_path(), " holds the weights after epoch ", in_file, " but ",
                  last_checkpoint_path(), " says the best epoch was ", *best + 1,
                  hint("the two files come from different runs; remove best.safetensors to resume without it"));
    this->set_best_weights(load_model_tensors(best_checkpoint_path(), this->model()));
  }

 private:  // state
  std::string directory_;
  bool resume_ = true;
  std::optional<int64_t> resumed_from_;
  std::unique_ptr<TrainingFaultPoints> faults_;  // only while a run is under TINYDDP_FAULT
  std::unique_ptr<CheckpointDirLock> lock_;      // rank 0, while run() lasts
};

}  // namespace tinyddp::nn
