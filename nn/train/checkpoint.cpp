#include "tinyddp/nn/train/checkpoint.h"

#include <charconv>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "tinyddp/core/error.h"

namespace tinyddp::nn {

namespace {

constexpr const char* kFormatVersion = "1";
const std::string kOptimizerPrefix = "optimizer.";
const std::string kExtraPrefix = "extra.";

// Metadata keys, in one place so that save and load cannot drift apart.
namespace key {
const std::string version = "tinyddp.checkpoint";
const std::string epoch = "tinyddp.epoch";
const std::string step = "tinyddp.step";
const std::string optimizer = "tinyddp.optimizer";
const std::string optimizer_lr = "tinyddp.optimizer.lr";
const std::string optimizer_initial_lr = "tinyddp.optimizer.initial_lr";
const std::string optimizer_steps = "tinyddp.optimizer.step_count";
const std::string scheduler = "tinyddp.scheduler";
const std::string scheduler_last_step = "tinyddp.scheduler.last_step";
const std::string scheduler_base_lr = "tinyddp.scheduler.base_lr";
}  // namespace key

// Shortest text that reads back as the same double (std::to_chars guarantees the round trip).
std::string exact_text(double value) {
  char buffer[32];
  auto [end, error] = std::to_chars(buffer, buffer + sizeof buffer, value);
  return std::string(buffer, end);
}

NamedTensors model_tensors(Module& model) {
  NamedTensors tensors;
  for (const NamedParameter& p : model.named_parameters()) tensors.emplace_back(p.name, p.parameter->value);
  return tensors;
}

// Reads the checkpoint's metadata: every lookup and number is checked, with the file named.
class MetadataReader {
 public:
  MetadataReader(const Metadata& metadata, const std::string& path) : metadata_(metadata), path_(path) {}

  bool has(const std::string& name) const { return metadata_.count(name) != 0; }

  const std::string& text(const std::string& name, const char* missing_hint) const {
    auto it = metadata_.find(name);
    TINYDDP_CHECK(it != metadata_.end(), path_, ": the metadata has no \"", name, "\"", hint(missing_hint));
    return it->second;
  }

  template <typename T>
  T number(const std::string& name) const {
    const std::string& value = text(name, "the file was not written by save_checkpoint, or was edited");
    T out{};
    auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), out);
    TINYDDP_CHECK(error == std::errc() && end == value.data() + value.size() && !value.empty(), path_, ": metadata \"",
                  name, "\" is \"", value, "\", not a number",
                  hint("the file was edited or damaged; save the checkpoint again"));
    return out;
  }

 private:
  const Metadata& metadata_;
  const std::string& path_;
};

// The copies a load will make, gathered while validating; nothing is written until all are known good.
class RestorePlan {
 public:
  RestorePlan(const SafetensorsFile& file, const std::string& path) : path_(path) {
    for (const auto& [name, tensor] : file.tensors) in_file_[name] = &tensor;
  }

  // Expects the file's tensor `name` to fit `destination` exactly (dtype and shape).
  void expect(const std::string& name, const Tensor& destination, const char* what) {
    expected_.insert(name);
    auto it = in_file_.find(name);
    TINYDDP_CHECK(it != in_file_.end(), path_, ": missing tensor \"", name, "\" (", what, ", expected ",
                  dtype_name(destination.dtype()), shape_str(destination.shape()), "); the file holds ",
                  in_file_.size(), " tensors",
                  hint("the file was saved from a different model or optimizer -- build the same ones"));
    const Tensor& found = *it->second;
    TINYDDP_CHECK(found.dtype() == destination.dtype(), path_, ": tensor \"", name, "\" (", what, ") is ",
                  dtype_name(found.dtype()), " in the file but ", dtype_name(destination.dtype()), " here",
                  hint("the file was not written for this model (convert it to ", dtype_name(destination.dtype()),
                       ")"));
    TINYDDP_CHECK(found.shape() == destination.shape(), path_, ": tensor \"", name, "\" (", what, ") has shape ",
                  shape_str(found.shape()), " in the file but ", shape_str(destination.shape()), " here",
                  hint("the file was saved from a model of another size -- build the same architecture"));
    copies_.emplace_back(destination, &found);
  }

  // File tensors nobody expects. Those under `skipped_prefix` (when not empty) are known and skipped.
  std::vector<std::string> unexpected(const std::string& skipped_prefix) const {
    std::vector<std::string> names;
    for (const auto& [name, tensor] : in_file_)
      if (!expected_.count(name) && (skipped_prefix.empty() || name.rfind(skipped_prefix, 0) != 0))
        names.push_back(name);
    return names;
  }

  // The only step that changes anything. Cannot fail on what was checked (dtype, shape).
  void copy() {
    for (auto& [destination, source] : copies_) destination.copy_from(*source);
  }

 private:
  const std::string& path_;
  std::map<std::string, const Tensor*> in_file_;
  std::set<std::string> expected_;
  std::vector<std::pair<Tensor, const Tensor*>> copies_;  // destination shares memory with the model
};

}  // namespace

void save_model(const std::string& path, Module& model) {
  // "format": "pt" is what Hugging Face tools look for in PyTorch-flavoured safetensors files.
  save_safetensors(path, model_tensors(model), {{"format", "pt"}});
}

void load_model(const std::string& path, Module& model, const CheckpointLoadOptions& options) {
  load_checkpoint(path, model, nullptr, nullptr, options);
}

void save_checkpoint(const std::string& path, Module& model, Optimizer* optimizer, LRScheduler* scheduler,
                     const CheckpointInfo& info) {
  NamedTensors tensors = model_tensors(model);
  Metadata metadata{{"format", "pt"},
                    {key::version, kFormatVersion},
                    {key::epoch, std::to_string(info.epoch)},
                    {key::step, std::to_string(info.step)}};
  if (optimizer) {
    metadata[key::optimizer] = optimizer->kind();
    metadata[key::optimizer_lr] = exact_text(optimizer->lr());
    metadata[key::optimizer_initial_lr] = exact_text(optimizer->initial_lr());
    metadata[key::optimizer_steps] = std::to_string(optimizer->step_count());
    for (auto& [name, tensor] : optimizer->state_tensors()) tensors.emplace_back(kOptimizerPrefix + name, tensor);
  }
  if (scheduler) {
    metadata[key::scheduler] = scheduler->kind();
    metadata[key::scheduler_last_step] = std::to_string(scheduler->last_step());
    metadata[key::scheduler_base_lr] = exact_text(scheduler->base_lr());
  }
  for (const auto& [name, value] : info.extra) {
    TINYDDP_CHECK(!name.empty(), "save_checkpoint: an extra metadata key is empty", hint("name every extra value"));
    metadata[kExtraPrefix + name] = value;
  }
  save_safetensors(path, tensors, metadata);
}

CheckpointInfo load_checkpoint(const std::string& path, Module& model, Optimizer* optimizer, LRScheduler* scheduler,
                               const CheckpointLoadOptions& options) {
  const SafetensorsFile file = load_safetensors(path);  // the file itself is validated here
  const MetadataReader metadata(file.metadata, path);
  const bool is_checkpoint = metadata.has(key::version);
  if (is_checkpoint) {
    const std::string& version = metadata.text(key::version, "");
    TINYDDP_CHECK(version == kFormatVersion, path, ": checkpoint format version \"", version,
                  "\", but this tinyddp reads version ", kFormatVersion,
                  hint("the file was written by another tinyddp version: load it with that one"));
  }
  TINYDDP_CHECK(is_checkpoint || (!optimizer && !scheduler), path,
                " is a plain model file (no tinyddp.checkpoint metadata), so it holds no optimizer or scheduler state",
                hint("load it with load_model, or pass nullptr for the optimizer and scheduler"));

  RestorePlan plan(file, path);
  for (const NamedParameter& p : model.named_parameters()) plan.expect(p.name, p.parameter->value, "model parameter");

  CheckpointInfo info;
  double lr = 0;
  int64_t optimizer_steps = 0, scheduler_last_step = 0;
  if (optimizer) {
    const std::string& kind = metadata.text(key::optimizer,
                                            "it was saved without an optimizer: pass nullptr for the optimizer");
    TINYDDP_CHECK(kind == optimizer->kind(), path, ": the checkpoint holds the state of a \"", kind,
                  "\" optimizer but a \"", optimizer->kind(), "\" optimizer was given",
                  hint("build the same optimizer",
                       " as the run that saved it, or pass nullptr to load only the model"));
    lr = metadata.number<double>(key::optimizer_lr);
    optimizer_steps = metadata.number<int64_t>(key::optimizer_steps);
    TINYDDP_CHECK(optimizer_steps >= 0, path, ": optimizer step count ", optimizer_steps, " is negative",
                  hint("the file was edited or damaged"));
    for (auto& [name, tensor] : optimizer->state_tensors())
      plan.expect(kOptimizerPrefix + name, tensor, "optimizer state");
  }
  if (scheduler) {
    const std::string& kind = metadata.text(key::scheduler,
                                            "it was saved without a scheduler: pass nullptr for the scheduler");
    TINYDDP_CHECK(kind == scheduler->kind(), path, ": the checkpoint holds a \"", kind, "\" scheduler but a \"",
                  scheduler->kind(), "\" scheduler was given",
                  hint("build the same schedule as the run that saved it"));
    scheduler_last_step = metadata.number<int64_t>(key::scheduler_last_step);
  }
  if (is_checkpoint) {
    info.epoch = metadata.number<int64_t>(key::epoch);
    info.step = metadata.number<int64_t>(key::step);
    for (const auto& [name, value] : file.metadata)
      if (name.rfind(kExtraPrefix, 0) == 0) info.extra[name.substr(kExtraPrefix.size())] = value;
  }

  // A checkpoint's optimizer state is known; it is skipped, not unexpected, when no optimizer is given.
  const std::vector<std::string> unexpected = plan.unexpected(is_checkpoint && !optimizer ? kOptimizerPrefix : "");
  if (!unexpected.empty() && !options.allow_unexpected) {
    std::string names;
    for (size_t i = 0; i < unexpected.size() && i < 5; ++i) names += (i ? ", \"" : "\"") + unexpected[i] + "\"";
    TINYDDP_FAIL(
        path, ": ", unexpected.size(), " unexpected tensor(s) that the model", optimizer ? " and optimizer" : "",
        " do not have: ", names, unexpected.size() > 5 ? ", ..." : "",
        hint("the file was saved from a different model; set CheckpointLoadOptions::allow_unexpected to ignore them"));
  }

  // Everything checked: from here on nothing can fail on the file's content.
  plan.copy();
  if (scheduler) scheduler->set_last_step(scheduler_last_step);  // sets the lr to the schedule's lr_at(t) ...
  if (optimizer) {
    optimizer->set_step_count(optimizer_steps);
    optimizer->set_lr(lr);  // ... and the saved lr, which is what the run had, wins
    optimizer->state_loaded();
  }
  return info;
}

}  // namespace tinyddp::nn
