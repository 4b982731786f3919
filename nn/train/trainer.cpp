#include "tinyddp/nn/train/trainer.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tinyddp/core/error.h"
#include "tinyddp/core/run_main.h"
#include "tinyddp/core/trace.h"
#include "tinyddp/kernels/ops.h"
#include "tinyddp/nn/optim/clip.h"
#include "tinyddp/nn/optim/schedulers.h"
#include "tinyddp/nn/optim/zero_redundancy_optimizer.h"
#include "tinyddp/nn/train/progress_bar.h"

namespace tinyddp::nn {

namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

namespace key {
const std::string history = "trainer.history";
const std::string best_epoch = "trainer.best_epoch";
const std::string best_loss = "trainer.best_loss";
const std::string global_step = "trainer.global_step";
const std::string extra_state = "trainer.extra_state";
}  // namespace key

Batch to_device(const Batch& batch, Device device) {
  // to() hands back the same tensor when it is already there: no copy on a CPU run.
  return {batch.inputs.defined() ? batch.inputs.to(device) : Tensor(),
          batch.targets.defined() ? batch.targets.to(device) : Tensor()};
}

// Stacks CPU tensors along their first dimension (the batches' outputs of inference()).
Tensor stack_rows(const std::vector<Tensor>& parts) {
  if (parts.empty()) return {};
  Shape shape = parts[0].shape();
  TINYDDP_CHECK(!shape.empty(), "inference: test_step returned a 0-D output",
                hint("return the model's output [batch, ...]"));
  int64_t rows = 0;
  for (const Tensor& t : parts) {
    bool same_row_shape = t.dim() == int64_t(shape.size()) &&
                          std::equal(shape.begin() + 1, shape.end(), t.shape().begin() + 1);
    TINYDDP_CHECK(same_row_shape && t.dtype() == parts[0].dtype(),
                  "inference: test_step outputs differ: ", parts[0].describe(), " and ", t.describe(),
                  hint("every batch's output must have the same shape past the batch dimension, and one dtype"));
    rows += t.size(0);
  }
  shape[0] = rows;
  Tensor out = Tensor::empty(shape, parts[0].dtype());
  char* dst = static_cast<char*>(out.raw_data());
  for (const Tensor& t : parts) {
    std::memcpy(dst, t.raw_data(), t.nbytes());
    dst += t.nbytes();
  }
  return out;
}

std::string describe_means(const std::map<std::string, double>& means) {
  std::ostringstream out;
  out.setf(std::ios::fixed);
  out.precision(4);
  // The loss first, as the seed prints it, then the metrics in name order.
  if (auto it = means.find("loss"); it != means.end()) out << " loss " << it->second;
  for (const auto& [name, value] : means)
    if (name != "loss") out << " " << name << " " << value;
  return out.str();
}

// "epoch 3/10  train loss 0.6931 accuracy 0.5120  valid loss 0.6902  lr 9.755e-04  0.41 s"
std::string epoch_summary(const EpochRecord& record, int64_t n_epoch) {
  std::ostringstream out;
  out << "epoch " << record.epoch + 1 << "/" << n_epoch << "  train" << describe_means(record.train);
  if (!record.valid.empty()) out << "  valid" << describe_means(record.valid);
  char tail[64];
  std::snprintf(tail, sizeof tail, "  lr %.3e  %.2f s", record.lr, record.seconds);
  return out.str() + tail;
}

json means_to_json(const std::map<std::string, double>& means) {
  json out = json::object();
  for (const auto& [name, value] : means) out[name] = value;  // NaN becomes null
  return out;
}

std::map<std::string, double> means_from_json(const json& in) {
  std::map<std::string, double> out;
  for (const auto& [name, value] : in.items())
    out[name] = value.is_number() ? value.get<double>() : std::numeric_limits<double>::quiet_NaN();
  return out;
}

}  // namespace

// Sums over one pass: each batch's means weighted by its sample count, so that the epoch's mean is a
// mean over samples even when the last batch is short, and adds up correctly across ranks.
struct Trainer::Totals {
  double samples = 0;
  double loss_sum = 0;
  std::map<std::string, double> metric_sums;
  std::vector<Tensor> outputs;  // inference() only

  void add(const StepOutput& step, int64_t batch_samples) {
    double n = double(batch_samples);
    samples += n;
    loss_sum += double(step.loss) * n;
    for (const auto& [name, value] : step.metrics) metric_sums[name] += value * n;
  }
  double mean_loss() const { return samples > 0 ? loss_sum / samples : 0; }
};

Trainer::Trainer(Module& model, std::vector<Device> devices, Optimizer& optimizer, LRScheduler* scheduler,
                 TrainerOptions options)
    : model_(model), devices_(std::move(devices)), optimizer_(optimizer), scheduler_(scheduler), options_(options) {
  // A program that trains ends a failure nobody catches with its message and exit code 1, not with
  // "terminate called after throwing" and SIGABRT (core/run_main.h).
  exit_on_uncaught_exception();
  TINYDDP_CHECK(!devices_.empty(), "Trainer: the device list is empty",
                hint("pass {Device::cpu()} or the GPUs to use"));
  TINYDDP_CHECK(options_.gradient_clip >= 0, "Trainer: gradient_clip is ", options_.gradient_clip,
                hint("use a positive maximum norm, or 0 to turn clipping off"));
  TINYDDP_CHECK(scheduler_ == nullptr || &scheduler_->optimizer() == &optimizer_,
                "Trainer: the scheduler drives another optimizer than the one given",
                hint("build the scheduler on the same optimizer object"));
  if (needs_loss_scaling(options_.precision)) {
    TINYDDP_CHECK(options_.loss_scaler.enabled, "Trainer: precision fp16 with loss_scaler.enabled = false; fp16's ",
                  "smallest values end at 6e-8, and unscaled gradients below that become zero",
                  hint("keep the loss ",
                       "scaler on (the default) or train in bf16, which has f32's range and needs none"));
    loss_scaler_ = std::make_unique<LossScaler>(options_.loss_scaler);
  }
  // The model moves to its device when the first pass starts (run_pass), not here: under MultiDevice
  // every worker builds this trainer before it knows its own device, and the spawner never trains.
  // Moving it now would give each of those processes a CUDA context on devices[0].
  device_ = devices_[0];
}

Trainer::Trainer(Module& model, Device device, Optimizer& optimizer, LRScheduler* scheduler, TrainerOptions options)
    : Trainer(model, std::vector<Device>{device}, optimizer, scheduler, options) {}

void Trainer::set_device(Device device) {
  device_ = device;
  model_.to(device);
}

void Trainer::set_distributed(int rank, int world_size, std::shared_ptr<comm::ProcessGroup> group) {
  TINYDDP_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "Trainer: rank ", rank, " of world size ",
                world_size, " is impossible", hint("0 <= rank < world_size"));
  rank_ = rank;
  world_size_ = world_size;
  group_ = std::move(group);
}

void Trainer::barrier() {
  if (group_) group_->barrier()->wait();
}

Tensor Trainer::forward(const Tensor& input) { return model_.forward(input); }

void Trainer::backward(const Tensor& output_grad) {
  // Nobody needs the gradient of the data itself: the first layer skips computing it.
  model_.backward(output_grad, /*want_input_grad=*/false);
}

void Trainer::run(int64_t n_epoch, DataLoader& loader, DataLoader* valid_loader) {
  TINYDDP_CHECK(n_epoch >= 0, "Trainer::run: n_epoch is ", n_epoch, hint("pass the number of epochs to train"));
  // Before on_run_begin: a checkpoint restored there sets the schedule's step, which needs its length.
  fit_schedule_to_run(n_epoch, loader.size(), world_size_);
  on_run_begin(n_epoch);  // an add-on may restore a checkpoint here, so epochs_done() is read after it

  std::optional<ProgressBar> bar;
  if (options_.log_bar && is_rank_zero()) bar.emplace();
  for (int64_t epoch = epochs_done_; epoch < n_epoch; ++epoch) {
    auto start = Clock::now();
    EpochRecord record;
    record.epoch = epoch;
    // A shuffling sampler draws its order from seed + epoch: every rank the same, every epoch a new one.
    loader.set_epoch(epoch);
    Totals train = run_pass(loader, true, false, epoch, n_epoch, bar ? &*bar : nullptr);
    record.train = reduce_means(train);
    if (valid_loader) {
      valid_loader->set_epoch(epoch);
      Totals valid = run_pass(*valid_loader, false, false, epoch, n_epoch, bar ? &*bar : nullptr);
      record.valid = reduce_means(valid);
    }
    if (scheduler_ && !options_.scheduler_step_on_batch) scheduler_->step();
    record.lr = optimizer_.lr();
    record.seconds = std::chrono::duration<double>(Clock::now() - start).count();

    history_.push_back(record);
    epochs_done_ = epoch + 1;
    keep_if_best(record);
    if (bar) bar->line(epoch_summary(record, n_epoch));
    on_epoch_end(record);
  }
  on_run_end();
}

InferenceResult Trainer::inference(DataLoader& loader) {
  Totals totals = run_pass(loader, false, /*keep_outputs=*/true, 0, 1, nullptr);
  InferenceResult result;
  result.outputs = stack_rows(totals.outputs);
  if (totals.samples > 0) {
    result.metrics["loss"] = totals.mean_loss();
    for (const auto& [name, sum] : totals.metric_sums) result.metrics[name] = sum / totals.samples;
  }
  return result;
}

Tensor Trainer::predict(DataLoader& loader) {
  PrecisionScope precision(options_.precision);
  std::vector<Tensor> outputs;
  for (auto it = loader.begin(); !(it == loader.end()); ++it)
    outputs.push_back(predict_step((*it).inputs.to(device_)).to(Device::cpu()));
  return stack_rows(outputs);
}

Tensor Trainer::predict(const Tensor& inputs, int64_t batch_size) {
  TINYDDP_CHECK(inputs.defined() && inputs.dim() >= 1, "Trainer::predict: the inputs are ", inputs.describe(),
                hint("pass the inputs with the samples along the first dimension, [samples, features]"));
  TINYDDP_CHECK(batch_size >= 1, "Trainer::predict: batch_size is ", batch_size,
                hint("pass the number of rows to run through the model at once, at least 1"));
  PrecisionScope precision(options_.precision);
  std::vector<Tensor> outputs;
  for (int64_t begin = 0; begin < inputs.size(0); begin += batch_size) {
    Tensor rows = inputs.slice_rows(begin, std::min(inputs.size(0), begin + batch_size));
    outputs.push_back(predict_step(rows.to(device_)).to(Device::cpu()));
  }
  return stack_rows(outputs);
}

Trainer::Totals Trainer::run_pass(DataLoader& loader, bool training, bool keep_outputs, int64_t epoch, int64_t n_epoch,
                                  ProgressBar* bar) {
  if (model_.device() != device_) model_.to(device_);
  PrecisionScope precision(options_.precision);
  Totals totals;
  const int64_t batches = loader.size();
  const char* phase = training ? "train" : "valid";
  int64_t done = 0;
  auto it = loader.begin();
  while (!(it == loader.end())) {
    Batch batch = to_device(*it, device_);
    int64_t samples = batch.inputs.size(0);
    if (training) {
      train_batch(batch, epoch, done, totals);
    } else {
      trace::Span span("test_step", "compute");
      StepOutput step = test_step(batch);
      totals.add(step, samples);
      if (keep_outputs && step.output.defined()) totals.outputs.push_back(step.output.to(Device::cpu()));
    }
    ++done;
    if (bar) bar->update(epoch, n_epoch, phase, done, batches, totals.mean_loss(), optimizer_.lr());
    // Waiting here means the loader's background thread fell behind the training step.
    trace::Span wait("wait for batch", "data", trace::Lane::data);
    ++it;
  }
  return totals;
}

void Trainer::train_batch(const Batch& batch, int64_t epoch, int64_t batch_index, Totals& totals) {
  optimizer().zero_grad();
  StepOutput step;
  {
    // Set for train_step and its backward pass, and cleared however they end (an exception included).
    struct TrainingFlag {
      bool& flag;
      explicit TrainingFlag(bool& f) : flag(f) { flag = true; }
      ~TrainingFlag() { flag = false; }
    } training(training_);
    {
      trace::Span span("train_step", "compute");
      step = train_step(batch);
    }
    TINYDDP_CHECK(step.output_grad.defined(), "Trainer: train_step returned no output_grad",
                  hint("return {.loss = loss, .output_grad = loss_fn.backward()} so the backward pass can run"));
    check_loss(step.loss, epoch, batch_index, step);
    if (loss_scaler_) loss_scaler_->scale_loss_gradient(step.output_grad);
    trace::Span span("backward pass", "compute");
    backward(step.output_grad);
  }
  if (loss_scaler_ && !unscale_gradients()) {
    ++skipped_steps_;
    optimizer().zero_grad();
    return;  // as for a non-finite loss: no step, the batch out of the means
  }
  if (!loss_scaler_ && options_.non_finite_loss == NonFiniteLoss::skip_step && !gradients_finite()) {
    ++skipped_steps_;
    optimizer().zero_grad();
    return;  // no step, and the batch stays out of the epoch's means
  }
  // Under DDP the gradients are already averaged over the ranks here, so every rank computes the
  // same norm and clips by the same factor: the replicas stay identical. Under ZeRO-1 the averages
  // live in the optimizer's shards, and it clips them (one all-reduce of the ranks' sums of squares).
  // Only gradients that exist count, as clip_grad_norm_ skips a None .grad (zero_grad set them to none).
  if (auto* zero = dynamic_cast<ZeroRedundancyOptimizer*>(stepping_optimizer_); zero && options_.gradient_clip > 0) {
    zero->clip_grad_norm(options_.gradient_clip);
  } else if (options_.gradient_clip > 0) {
    std::vector<Parameter*> with_grad;
    for (Parameter* p : model_.parameters())
      if (p->has_grad) with_grad.push_back(p);
    clip_grad_norm(with_grad, options_.gradient_clip);
  }
  {
    trace::Span span("optimizer step", "compute");
    if (stepping_optimizer_) stepping_optimizer_->set_lr(optimizer_.lr());  // the scheduler sets the given one's
    optimizer().step();
  }
  if (scheduler_ && options_.scheduler_step_on_batch) scheduler_->step();
  ++global_step_;
  totals.add(step, batch.inputs.size(0));
}

// A NaN or infinite loss: stop before its gradient reaches the weights, or (skip_step) make the
// gradient NaN so that, under DDP, the average tells every rank to skip this step together.
void Trainer::check_loss(float loss, int64_t epoch, int64_t batch_index, StepOutput& step) {
  if (std::isfinite(loss)) return;
  if (options_.non_finite_loss == NonFiniteLoss::skip_step) {
    kernels::fill(step.output_grad, std::numeric_limits<float>::quiet_NaN());
    return;
  }
  TINYDDP_FAIL("Trainer: the loss is ", loss, " at epoch ", epoch + 1, ", batch ", batch_index + 1, " (step ",
               global_step_ + 1, ", rank ", rank_, "); stopped before the optimizer step wrote it into the weights",
               hint("look for NaN or huge values in the inputs and in the weights it started from (a loaded model), "
                    "lower the learning rate,",
                    " or set TrainerOptions::non_finite_loss = NonFiniteLoss::skip_step to skip such steps"));
}

bool Trainer::unscale_gradients() {
  // The one finite check of the step, on the gradients every rank agrees on (see gradients_finite),
  // made on the scaled gradients: an inf divided by S is still inf.
  const bool finite = gradients_finite();
  std::vector<Parameter*> stepped;
  if (auto* zero = dynamic_cast<ZeroRedundancyOptimizer*>(stepping_optimizer_)) {
    for (const NamedParameter& p : zero->local_optimizer().params()) stepped.push_back(p.parameter);  // the shards
  } else {
    stepped = model_.parameters();
  }
  loss_scaler_->unscale(stepped, finite);
  loss_scaler_->update(finite);
  return finite;
}

bool Trainer::gradients_finite() {
  if (auto* zero = dynamic_cast<ZeroRedundancyOptimizer*>(stepping_optimizer_)) return zero->gradients_finite();
  double sum = 0;
  for (Parameter* p : model_.parameters())
    if (p->has_grad) sum += kernels::sum_of_squares(p->grad);
  return std::isfinite(sum);
}

std::map<std::string, double> Trainer::reduce_means(Totals& totals) {
  // One small all-reduce of every sum at once: [samples, loss, metric...], metrics in name order
  // (every rank's train_step returns the same names, so the vectors line up).
  std::vector<double> sums{totals.samples, totals.loss_sum};
  for (const auto& [name, sum] : totals.metric_sums) sums.push_back(sum);
  all_reduce_sum(sums);
  std::map<std::string, double> means;
  if (sums[0] <= 0) return means;
  means["loss"] = sums[1] / sums[0];
  size_t i = 2;
  for (const auto& [name, sum] : totals.metric_sums) means[name] = sums[i++] / sums[0];
  return means;
}

void Trainer::fit_schedule_to_run(int64_t n_epoch, int64_t batches_per_epoch, int world_size) {
  auto* cosine = dynamic_cast<CosineAnnealing*>(scheduler_);
  if (!cosine) return;
  const bool per_batch = options_.scheduler_step_on_batch;
  const int64_t steps = per_batch ? n_epoch * batches_per_epoch : n_epoch;
  if (cosine->sized_by_run()) {
    if (steps > 0) cosine->set_length_of_run(steps);
    return;
  }
  // Stepped per epoch, any length goes (the seed anneals over 100 epochs and trains 10).
  if (!per_batch) return;
  // The seed's _scheduler_step_check: a cosine schedule stepped per batch must cover every batch,
  // or past total_iters the learning rate climbs back up again.
  const int64_t total = cosine->total_iters();
  TINYDDP_CHECK(total >= steps, "Trainer::run: the cosine schedule has total_iters ", total, " but ", n_epoch,
                " epochs of ", batches_per_epoch, " batches step it ", steps, " times",
                hint("build it with total_iters >= ", steps, ", or with nn::length_of_run, or step it per epoch"));
  // On several ranks each one steps through its share of the loader only: a length counted over the
  // whole loader is never reached, and the decay would stop part-way without a word.
  TINYDDP_CHECK(world_size == 1 || total == steps, "Trainer::run: the cosine schedule has total_iters ", total,
                " but this run steps it ", steps, " times (", n_epoch, " epochs of ", batches_per_epoch,
                " batches: each of the ", world_size, " ranks trains on its own share of the loader), so the ",
                "learning rate would end at ", cosine->lr_at(steps), " instead of ", cosine->eta_min(),
                hint("build the schedule with nn::length_of_run to let the run size it, or with total_iters = ",
                     steps));
}

void Trainer::keep_if_best(const EpochRecord& record) {
  const auto& means = record.valid.empty() ? record.train : record.valid;
  auto it = means.find("loss");
  if (it == means.end() || std::isnan(it->second)) return;
  if (best_epoch_ && !(it->second < best_loss_)) return;
  best_epoch_ = record.epoch;
  best_loss_ = it->second;
  // A copy, on the CPU: the parameters go on changing with every later step.
  best_weights_.clear();
  for (const NamedParameter& p : model_.named_parameters()) {
    const Tensor& value = p.parameter->value;
    best_weights_.emplace_back(p.name, value.device().is_cpu() ? value.clone() : value.to(Device::cpu()));
  }
}

void Trainer::apply_best_weights() {
  TINYDDP_CHECK(!best_weights_.empty(), "Trainer::apply_best_weights: there are no best weights yet",
                hint("run at least one epoch first"));
  for (const auto& [name, weights] : best_weights_) {
    Parameter& p = model_.parameter(name);
    TINYDDP_CHECK(p.value.shape() == weights.shape(), "Trainer::apply_best_weights: ", name, " is ", p.value.describe(),
                  " but the kept copy is ", weights.describe(), hint("the model changed shape after training"));
    p.value.copy_from(weights);
  }
}

namespace {

json record_to_json(const EpochRecord& r) {
  return {{"epoch", r.epoch},
          {"train", means_to_json(r.train)},
          {"valid", means_to_json(r.valid)},
          {"lr", r.lr},
          {"seconds", r.seconds}};
}

// Throws nlohmann's exceptions for anything that is not a record; the callers say where it came from.
EpochRecord record_from_json(const json& r) {
  EpochRecord record;
  record.epoch = r.at("epoch").get<int64_t>();
  record.train = means_from_json(r.at("train"));
  record.valid = means_from_json(r.at("valid"));
  record.lr = r.at("lr").get<double>();
  record.seconds = r.at("seconds").get<double>();
  return record;
}

}  // namespace

std::string epoch_record_json(const EpochRecord& record) { return record_to_json(record).dump(); }

EpochRecord epoch_record_from_json(const std::string& line) {
  try {
    return record_from_json(json::parse(line));
  } catch (const json::exception& e) {
    TINYDDP_FAIL("not an epoch record (", e.what(), "): ", line.substr(0, 80), line.size() > 80 ? "..." : "",
                 hint("the history file was edited or damaged"));
  }
}

Metadata Trainer::progress_metadata(bool with_history) const {
  Metadata out{{key::global_step, std::to_string(global_step_)}};
  if (with_history) {
    json history = json::array();
    for (const EpochRecord& r : history_) history.push_back(record_to_json(r));
    out[key::history] = history.dump();
  }
  if (Metadata extra = get_extra_state(); !extra.empty()) out[key::extra_state] = json(extra).dump();
  if (best_epoch_) {
    out[key::best_epoch] = std::to_string(*best_epoch_);
    out[key::best_loss] = json(best_loss_).dump();  // shortest text that reads back exactly
  }
  if (loss_scaler_) out.merge(loss_scaler_->state());
  return out;
}

void Trainer::restore_progress(const Metadata& metadata, int64_t epochs_done) {
  TINYDDP_CHECK(epochs_done >= 0, "Trainer::restore_progress: epochs_done is ", epochs_done,
                hint("pass the number of finished epochs"));
  std::vector<EpochRecord> history;
  int64_t global_step = 0;
  std::optional<int64_t> best_epoch;
  double best_loss = 0;
  std::optional<Metadata> extra_state;
  try {
    if (auto it = metadata.find(key::history); it != metadata.end()) {
      for (const json& r : json::parse(it->second)) {
        EpochRecord record = record_from_json(r);
        if (record.epoch < epochs_done) history.push_back(std::move(record));
      }
    }
    if (auto it = metadata.find(key::global_step); it != metadata.end()) global_step = std::stoll(it->second);
    if (auto it = metadata.find(key::best_epoch); it != metadata.end()) {
      best_epoch = std::stoll(it->second);
      best_loss = json::parse(metadata.at(key::best_loss)).get<double>();
    }
    if (auto it = metadata.find(key::extra_state); it != metadata.end())
      extra_state = json::parse(it->second).get<Metadata>();
  } catch (const std::exception& e) {
    TINYDDP_FAIL("Trainer::restore_progress: the saved progress (", key::history, ", ", key::best_epoch, ", ",
                 key::global_step, ", ", key::extra_state, ") does not parse: ", e.what(),
                 hint("the checkpoint was edited or written by another program; start without it"));
  }
  history_ = std::move(history);
  epochs_done_ = epochs_done;
  global_step_ = global_step;
  best_epoch_ = best_epoch;
  best_loss_ = best_loss;
  if (extra_state) set_extra_state(*extra_state);
  if (loss_scaler_) loss_scaler_->load_state(metadata);
}

namespace {
double batch_accuracy(const Tensor& logits, const Batch& batch) {
  return double(kernels::count_correct(logits, batch.targets)) / double(batch.inputs.size(0));
}
}  // namespace

StepOutput ClassifierTrainer::train_step(const Batch& batch) {
  Tensor logits = forward(batch.inputs);
  float loss = loss_fn_.forward(logits, batch.targets);
  return {.loss = loss, .output_grad = loss_fn_.backward(), .metrics = {{"accuracy", batch_accuracy(logits, batch)}}};
}

StepOutput ClassifierTrainer::test_step(const Batch& batch) {
  Tensor logits = forward(batch.inputs);
  return {.loss = loss_fn_.evaluate(logits, batch.targets),
          .output = logits,
          .metrics = {{"accuracy", batch_accuracy(logits, batch)}}};
}

}  // namespace tinyddp::nn
