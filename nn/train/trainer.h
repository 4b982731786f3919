// Trainer: the training loop, written once, with the parts that differ per model left to a subclass.
// It is the C++ form of the seed's zae-engine Trainer:
//
//   Python (the seed)                                    C++ (tinyddp)
//   ---------------------------------------------------  ----------------------------------------------------
//   class DummyTrainer(Trainer):                         class DummyTrainer : public nn::Trainer {
//                                                         public:
//                                                          using nn::Trainer::Trainer;
//       def train_step(self, batch):                       nn::StepOutput train_step(const nn::Batch& b) override {
//           x, y = batch                                     Tensor logits = forward(b.inputs);
//           loss = F.cross_entropy(self.model(x), y)         float loss = loss_fn_.forward(logits, b.targets);
//           return {'loss': loss}                            return {.loss = loss, .output_grad = loss_fn_.backward()};
//                                                          }
//       def test_step(self, batch): ...                    nn::StepOutput test_step(const nn::Batch& b) override {...}
//                                                          nn::CrossEntropyLoss loss_fn_;
//                                                        };
//   trainer = Trainer.add_on(MultiGPUAddon)(             using MyTrainer = nn::WithAddOns<DummyTrainer,
//   nn::MultiDevice>;
//       model=model, device=devices, mode='train',       MyTrainer trainer(model, devices, opt, &sched, {});
//       optimizer=opt, scheduler=sched,
//       init_method='tcp://localhost:12355')             trainer.set_init_method("tcp://localhost:12355");
//   trainer.run(n_epoch=10, loader=loader,               trainer.run(10, loader);
//               valid_loader=None)
//   torch.save(trainer.model.state_dict(), path)         if (trainer.is_main_process()) nn::save_model(path,
//   trainer.model());
//
// What one training batch does (run_batch in the seed):
//   1. the batch is moved to the trainer's device;
//   2. the gradients are zeroed, train_step(batch) runs the forward pass and the loss, and returns the
//      loss and d(loss)/d(output) (tinyddp has no autograd: that tensor is what `loss.backward()` starts from);
//   3. the Trainer runs the backward pass with it -- under DDP this is where the gradient buckets are
//      all-reduced, overlapping the layers still to go -- then clips the gradients (gradient_clip),
//      steps the optimizer, and steps the scheduler when it steps per batch.
// After each epoch (and a pass over valid_loader, if given) the epoch's mean loss and metrics go into
// history(), the scheduler steps when it steps per epoch, and if the loss (the validation loss when
// there is a validation set) is the lowest so far, the weights are *copied* into best_weights(). (The
// seed keeps a reference to state_dict(), whose tensors go on changing with training; a copy is what
// "the best weights" has to mean.)
//
// Add-ons (nn/addons/) are mixin templates, several at once, in any order:
//   nn::WithAddOns<DummyTrainer, nn::MultiDevice, nn::StateManager, nn::Trace>
//   == nn::MultiDevice<nn::StateManager<nn::Trace<DummyTrainer>>>
// Each derives from the class it wraps and overrides the callbacks below (on_run_begin, on_epoch_end,
// ...; calling the wrapped class's version too), so they stack like Python's class decorators, but
// checked at compile time. (Callbacks, as Keras and Lightning call them: "hook" in this library means
// a parameter's grad-ready hook, DDP's comm hook or a module's forward pre-hook.)
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "tinyddp/comm/process_group.h"
#include "tinyddp/core/safetensors.h"
#include "tinyddp/core/tensor.h"
#include "tinyddp/nn/data/data_loader.h"
#include "tinyddp/nn/loss.h"
#include "tinyddp/nn/module.h"
#include "tinyddp/nn/optim/optimizer.h"
#include "tinyddp/nn/optim/schedulers.h"
#include "tinyddp/nn/precision/loss_scaler.h"
#include "tinyddp/nn/precision/precision.h"

namespace tinyddp::nn {

class ProgressBar;

// What train_step and test_step return: the seed's {'loss': loss, ...} dictionary.
struct StepOutput {
  // The batch's mean loss. Required.
  float loss = 0;
  // train_step only: d(loss)/d(model output), e.g. CrossEntropyLoss::backward(). The Trainer runs the
  // backward pass from it (the seed's `step_dict['loss'].backward()`).
  Tensor output_grad{};
  // Optional: the model's output for this batch; inference() stacks them.
  Tensor output{};
  // Optional: more per-batch means to log beside the loss ("accuracy").
  std::map<std::string, double> metrics{};
};

// What a training step whose loss is not finite (NaN or infinite) does.
enum class NonFiniteLoss {
  // Stop the run with an error that names the epoch, the batch, the step and the rank, before the
  // optimizer step spreads the NaN into the weights (the default: such a loss is almost always a bug,
  // a bad input or too high a learning rate, and training on would only write NaN weights).
  stop,
  // Skip the step: no optimizer step, the batch left out of the epoch's means, a count kept in
  // skipped_steps(). What PyTorch's AMP GradScaler does with a step whose gradients overflowed. Under
  // DDP every rank skips together: the decision is made on the gradients after they are averaged
  // (the same on every rank), and a rank whose own loss is not finite makes its gradient NaN first,
  // so the average carries it to all.
  skip_step,
};

struct TrainerOptions {
  // Show progress: a live bar on a terminal, one line per epoch otherwise (on stderr, rank 0 only).
  bool log_bar = true;
  // Step the scheduler after every batch (true) or after every epoch (false, the seed's default).
  bool scheduler_step_on_batch = false;
  // Clip the global gradient norm to this before each optimizer step; 0: no clipping.
  double gradient_clip = 0;
  // A NaN or infinite loss stops the run (the default), or its step is skipped.
  NonFiniteLoss non_finite_loss = NonFiniteLoss::stop;
  // The precision of the model's GEMMs in every step (train_step, backward, test_step, predict):
  // fp32, or bf16 / fp16 mixed, torch.autocast's choice (nn/precision/precision.h). The weights, the
  // optimizer and the checkpoints stay f32 in every one.
  Precision precision = Precision::fp32;
  // fp16's dynamic loss scaling (GradScaler's knobs and defaults; nn/precision/loss_scaler.h). Used
  // under fp16 only, which refuses enabled = false. Its state goes into checkpoints with the progress.
  LossScalerOptions loss_scaler{};
};

// One epoch of history. Means are over samples (each batch weighted by its size), over every rank.
struct EpochRecord {
  int64_t epoch = 0;                    // 0-based
  std::map<std::string, double> train;  // "loss" and every metric train_step returned
  std::map<std::string, double> valid;  // the same for valid_loader; empty without one
  double lr = 0;                        // the learning rate at the end of the epoch
  double seconds = 0;
};

// One record as one line of JSON, and back: what the history file beside a checkpoint holds, a line
// an epoch (nn/train/addons/history_file.h). epoch_record_from_json throws tinyddp::Error for a line
// that is not such a record.
std::string epoch_record_json(const EpochRecord& record);
EpochRecord epoch_record_from_json(const std::string& line);

struct InferenceResult {
  Tensor outputs;                         // every batch's StepOutput::output, stacked along the rows (CPU)
  std::map<std::string, double> metrics;  // "loss" and every metric, means over the samples
};

class Trainer {
 public:
  // `model`, `optimizer` and `scheduler` are the caller's and must outlive the trainer; `scheduler` may
  // be null. The model moves to devices[0] when training (or inference) starts; a MultiDevice worker
  // moves it to its own device instead, and MultiDevice's spawner never moves it.
  Trainer(Module& model, std::vector<Device> devices, Optimizer& optimizer, LRScheduler* scheduler,
          TrainerOptions options = {});
  Trainer(Module& model, Device device, Optimizer& optimizer, LRScheduler* scheduler, TrainerOptions options = {});
  virtual ~Trainer() = default;
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Trains until `n_epoch` epochs are done in all: epochs are counted across calls (and across a
  // resumed checkpoint), so run(10) after a crash in epoch 7 runs epochs 7, 8 and 9.
  //
  // A cosine schedule stepped per batch is checked against the run before anything trains: one built
  // with nn::length_of_run gets the run's length here; an explicit total_iters shorter than the run
  // is refused (past its end the cosine climbs back up), and so is, on several ranks, one longer than
  // the run -- that is the length written as epochs * loader.size() while each rank steps through its
  // own share of the loader only, which would stop the decay half-way on 2 ranks without a word.
  virtual void run(int64_t n_epoch, DataLoader& loader, DataLoader* valid_loader = nullptr);
  // Runs test_step over `loader` in this process, on device(), and collects the outputs and metrics.
  InferenceResult inference(DataLoader& loader);
  // The model's outputs for inputs that have no targets, in this process, on device(): predict_step
  // on each batch of the loader (its targets, if any, are not read), or on `inputs` in row blocks of
  // `batch_size`; the outputs stacked along the rows, on the CPU.
  Tensor predict(DataLoader& loader);
  Tensor predict(const Tensor& inputs, int64_t batch_size = 1024);

  // ---- what a subclass writes ----
  virtual StepOutput train_step(const Batch& batch) = 0;
  virtual StepOutput test_step(const Batch& batch) = 0;
  // What predict() returns for one batch of inputs: the model's output unless overridden (to apply a
  // softmax, say).
  virtual Tensor predict_step(const Tensor& inputs) { return forward(inputs); }
  // A subclass's own members that must outlive the process: saved with every training state
  // (StateManager's checkpoints, and what a MultiDevice spawner gets back from rank 0) and handed back
  // to set_extra_state when that state is loaded. PyTorch's Module.get_extra_state/set_extra_state,
  // with named strings as the state. Default: nothing.
  virtual Metadata get_extra_state() const { return {}; }
  virtual void set_extra_state(const Metadata& state) { (void)state; }

  // ---- state ----
  Module& model() { return model_; }
  // The optimizer that steps the weights: the one given, or the one an add-on put in its place while
  // a worker trains (MultiDevice's ZeroRedundancyOptimizer, which takes the given one's settings and
  // follows its lr). Checkpoints save and load this one.
  Optimizer& optimizer() { return stepping_optimizer_ ? *stepping_optimizer_ : optimizer_; }
  // The optimizer the caller gave (its lr is what the scheduler sets).
  Optimizer& given_optimizer() { return optimizer_; }
  LRScheduler* scheduler() { return scheduler_; }
  const std::vector<Device>& devices() const { return devices_; }
  Device device() const { return device_; }
  const TrainerOptions& options() const { return options_; }
  const std::vector<EpochRecord>& history() const { return history_; }
  int64_t epochs_done() const { return epochs_done_; }
  int64_t global_step() const { return global_step_; }
  // Training steps skipped for a non-finite loss or gradient (NonFiniteLoss::skip_step, or fp16's
  // loss scaler after an overflow), in all.
  int64_t skipped_steps() const { return skipped_steps_; }
  // fp16's loss scaler (its scale, its counts); null under fp32 and bf16.
  const LossScaler* loss_scaler() const { return loss_scaler_.get(); }

  // The lowest epoch loss so far, the epoch it came from, and a copy of the weights then (CPU).
  std::optional<int64_t> best_epoch() const { return best_epoch_; }
  double best_loss() const { return best_loss_; }
  const NamedTensors& best_weights() const { return best_weights_; }
  // Copies best_weights() into the model (the seed's apply_weights()).
  void apply_best_weights();

  // ---- who this process is ----
  // In a worker, its rank and the job's size; in a MultiDevice spawner after run(), rank 0 (whose
  // state it holds) and the size of the job it ran.
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  bool is_rank_zero() const { return rank_ == 0; }
  // True in exactly one process of a job: the one that should save and print results after run().
  // Without MultiDevice that is this process; MultiDevice says which (see its header).
  virtual bool is_main_process() const { return true; }

  // ---- progress, as checkpoints and spawned workers hand it on ----
  // The history, the best loss and epoch, and the step count as string metadata ("trainer.*"), and
  // the loss scaler's state ("loss_scaler.*") under fp16. Without the history, the metadata's size does
  // not grow with the epochs (StateManager keeps the history in a file of its own).
  Metadata progress_metadata(bool with_history = true) const;
  // Restores what progress_metadata() wrote; `epochs_done` epochs count as finished. Metadata without
  // a history leaves the history empty.
  void restore_progress(const Metadata& metadata, int64_t epochs_done);
  // Replaces the history (the records of the epochs done, in order), as a history file holds it.
  void restore_history(std::vector<EpochRecord> history) { history_ = std::move(history); }
  void set_best_weights(NamedTensors weights) { best_weights_ = std::move(weights); }

 protected:
  // The model's forward and backward passes as this trainer runs them. train_step and test_step call
  // forward(); the Trainer calls backward() with StepOutput::output_grad. MultiDevice routes both
  // through DistributedDataParallel.
  virtual Tensor forward(const Tensor& input);
  virtual void backward(const Tensor& output_grad);
  // True while a training batch runs (train_step and its backward pass); false in test_step. DDP
  // arms its gradient reducer only for training forwards.
  bool is_training() const { return training_; }

  // Callbacks for add-ons; an override calls the wrapped class's version too.
  virtual void on_run_begin(int64_t n_epoch) { (void)n_epoch; }
  virtual void on_epoch_end(const EpochRecord& record) { (void)record; }
  virtual void on_run_end() {}
  // Sums `values` element-wise over every rank (MultiDevice); a single process has nothing to add.
  virtual void all_reduce_sum(std::vector<double>& values) { (void)values; }
  // True when an add-on saves the optimizer's state at every epoch end (StateManager with a
  // directory): an add-on that shards that state (MultiDevice's ZeRO-1) then consolidates it first.
  virtual bool saves_state_each_epoch() const { return false; }
  // In a MultiDevice spawner, once every worker has ended, however it ended: an add-on removes what a
  // worker killed in the middle of a write leaves in the add-on's files. Must not throw.
  virtual void on_workers_ended() {}
  // What the user can do to continue a run that was stopped before its end ("run it again to resume
  // from ..."), or "" when nothing was kept. A MultiDevice spawner stopped by a signal ends its
  // message with it.
  virtual std::string resume_hint() const { return ""; }

  void set_device(Device device);
  // `group` may be null: a spawner records the job it ran, without taking part in it.
  void set_distributed(int rank, int world_size, std::shared_ptr<comm::ProcessGroup> group);
  // Sizes a length_of_run schedule for `n_epoch` epochs of `batches_per_epoch` batches on each of
  // `world_size` ranks, and refuses a per-batch cosine schedule of a length the run does not take
  // (see run()). run() calls it; a MultiDevice spawner calls it before it starts its workers.
  void fit_schedule_to_run(int64_t n_epoch, int64_t batches_per_epoch, int world_size);
  comm::ProcessGroup* process_group() { return group_.get(); }
  // Puts `optimizer` (null: none) in the given one's place for step(), zero_grad() and checkpoints;
  // before each step it is given the given optimizer's lr.
  void set_stepping_optimizer(Optimizer* optimizer) { stepping_optimizer_ = optimizer; }
  // Waits for every rank (nothing to wait for in a single process).
  void barrier();

 private:
  struct Totals;  // sums of one pass over a loader
  Totals run_pass(DataLoader& loader, bool training, bool keep_outputs, int64_t epoch, int64_t n_epoch,
                  ProgressBar* bar);
  void train_batch(const Batch& batch, int64_t epoch, int64_t batch_index, Totals& totals);
  void check_loss(float loss, int64_t epoch, int64_t batch_index, StepOutput& step);
  bool gradients_finite();
  // Under fp16: whether the step may go on -- the gradients finite (then unscaled) -- and the scale moved.
  bool unscale_gradients();
  std::map<std::string, double> reduce_means(Totals& totals);
  void keep_if_best(const EpochRecord& record);

  Module& model_;
  std::vector<Device> devices_;
  Device device_;
  Optimizer& optimizer_;
  Optimizer* stepping_optimizer_ = nullptr;
  LRScheduler* scheduler_;
  TrainerOptions options_;

  bool training_ = false;
  int rank_ = 0, world_size_ = 1;
  std::shared_ptr<comm::ProcessGroup> group_;

  std::vector<EpochRecord> history_;
  int64_t epochs_done_ = 0;
  int64_t global_step_ = 0;
  int64_t skipped_steps_ = 0;
  std::unique_ptr<LossScaler> loss_scaler_;
  std::optional<int64_t> best_epoch_;
  double best_loss_ = 0;
  NamedTensors best_weights_;
};

// The user's part for the most common job, ready-made: a classifier whose model outputs logits,
// trained with cross-entropy; both steps also report the batch's accuracy, and test_step returns the
// logits (inference() stacks them). Derive from it to change one step and keep the other (the digits
// example adds input noise in train_step, then calls this one).
class ClassifierTrainer : public Trainer {
 public:
  using Trainer::Trainer;
  StepOutput train_step(const Batch& batch) override;
  StepOutput test_step(const Batch& batch) override;

 private:
  CrossEntropyLoss loss_fn_;
};

// ---- composing add-ons ----
namespace detail {
template <class Base, template <class> class... AddOns>
struct ApplyAddOns {
  using type = Base;
};
template <class Base, template <class> class First, template <class> class... Rest>
struct ApplyAddOns<Base, First, Rest...> {
  using type = First<typename ApplyAddOns<Base, Rest...>::type>;
};
}  // namespace detail

// WithAddOns<T, A, B, C> is A<B<C<T>>>: the seed's Trainer.add_on(A, B, C) applied to T.
template <class UserTrainer, template <class> class... AddOns>
using WithAddOns = typename detail::ApplyAddOns<UserTrainer, AddOns...>::type;

}  // namespace tinyddp::nn
