// Dataset: numbered samples, and batches of them.
//
// A Dataset answers two questions: how many samples there are, and what sample i is. The DataLoader
// asks for whole batches (get_batch) on its background thread; the default get_batch stacks get(i)
// sample by sample, and a dataset that holds everything in memory (TensorDataset) overrides it with
// one gather. Both are const and must be safe to call from another thread while the caller trains.
#pragma once

#include <cstdint>
#include <vector>

#include "tinyddp/core/tensor.h"

namespace tinyddp::nn {

// A batch (or, from Dataset::get, one sample): what goes into the model and what it should predict.
// For a batch, both tensors have the batch as their first dimension: inputs [B, D], targets [B] (class
// indices, i64) or [B, K] (f32). A single sample has the shapes without that dimension.
struct Batch {
  Tensor inputs;
  Tensor targets;
};

class Dataset {
 public:
  virtual ~Dataset() = default;

  virtual int64_t size() const = 0;
  // Sample `index`, 0 <= index < size().
  virtual Batch get(int64_t index) const = 0;
  // The samples at `indices`, stacked along a new first dimension. The default calls get() for each
  // index and copies the results into one batch; all samples must have equal shapes and dtypes.
  virtual Batch get_batch(const std::vector<int64_t>& indices) const;
};

// Samples held in memory as two tensors whose first dimension is the sample: like PyTorch's
// TensorDataset(features, targets).
class TensorDataset : public Dataset {
 public:
  // features: f32 [N, ...] (usually [N, D]); targets: i64 [N] (class indices) or f32 [N] / [N, K].
  // Both on the CPU: batches are built on the CPU and moved to a device by the caller.
  TensorDataset(Tensor features, Tensor targets);

  int64_t size() const override { return features_.size(0); }
  Batch get(int64_t index) const override;
  // Copies the selected rows of both tensors into a new batch: one memcpy per row and tensor.
  Batch get_batch(const std::vector<int64_t>& indices) const override;

  const Tensor& features() const { return features_; }
  const Tensor& targets() const { return targets_; }

 private:
  Tensor features_, targets_;
};

}  // namespace tinyddp::nn
