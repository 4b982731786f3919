// Checkpoints: a model's weights, and optionally its optimizer and scheduler state, in one safetensors
// file that PyTorch reads.
//
// The model's tensors are stored under the names PyTorch gives the same model's state_dict keys
// ("0.weight", "0.bias", ...), with the same shapes (Linear weights [out, in]), so in Python
//     model.load_state_dict(safetensors.torch.load_file("model.safetensors"))
// loads a file written by save_model, and load_model reads a file PyTorch wrote.
//
// save_checkpoint adds what resuming a run needs: the optimizer's state tensors under
// "optimizer.<state name>" ("optimizer.exp_avg.0.weight"), and string metadata:
//     tinyddp.checkpoint   format version ("1")
//     tinyddp.optimizer    its kind ("adam"), with .lr, .initial_lr and .step_count
//     tinyddp.scheduler    its kind ("cosine"), with .last_step and .base_lr
//     tinyddp.epoch, tinyddp.step, and extra.<key> for the caller's own values
// (PyTorch's load_state_dict would reject the optimizer.* tensors: give it model files, or filter them.)
//
// Loading validates everything before it changes anything: every tensor the model (and optimizer)
// needs must be present with the same dtype and shape, the optimizer kind must match, no unknown
// tensor may be left over (unless allowed), and the metadata must parse. Only then are the values
// copied. So a wrong or damaged file throws an error naming the tensor, what was expected and what
// was found, and leaves the model, the optimizer and the scheduler exactly as they were.
// Files are written atomically (see save_safetensors): a crash mid-save never damages the old file.
#pragma once

#include <cstdint>
#include <string>

#include "tinyddp/core/safetensors.h"
#include "tinyddp/nn/module.h"
#include "tinyddp/nn/optim/optimizer.h"
#include "tinyddp/nn/optim/schedulers.h"

namespace tinyddp::nn {

// Where the run was when the checkpoint was saved, and anything else the caller wants kept.
struct CheckpointInfo {
  int64_t epoch = 0;
  int64_t step = 0;
  Metadata extra;  // the caller's own string values; stored as "extra.<key>"
};

struct CheckpointLoadOptions {
  // Ignore tensors in the file that the model and optimizer do not have (PyTorch's strict=False,
  // but missing tensors are still an error).
  bool allow_unexpected = false;
};

// A plain state dict: the model's parameters under their PyTorch names, nothing else.
void save_model(const std::string& path, Module& model);
// Loads parameters saved by save_model, save_checkpoint (the optimizer state in it is skipped) or
// PyTorch. The model must have the same architecture as the one saved.
void load_model(const std::string& path, Module& model, const CheckpointLoadOptions& options = {});

// Everything needed to resume training. `optimizer` and `scheduler` may be null.
void save_checkpoint(const std::string& path, Module& model, Optimizer* optimizer, LRScheduler* scheduler,
                     const CheckpointInfo& info = {});
// Restores what save_checkpoint stored into the given objects (null ones are skipped) and returns
// the epoch, step and extra values. The optimizer must be of the kind that was saved.
CheckpointInfo load_checkpoint(const std::string& path, Module& model, Optimizer* optimizer, LRScheduler* scheduler,
                               const CheckpointLoadOptions& options = {});

}  // namespace tinyddp::nn
