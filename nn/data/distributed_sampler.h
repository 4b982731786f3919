// DistributedSampler: each rank's share of a data set, with PyTorch's semantics
// (torch.utils.data.distributed.DistributedSampler).
//
// Data parallelism only works if the ranks train on *different* samples of each global batch. The
// sampler gives every rank the same epoch order (shuffled from seed + epoch, so all ranks agree
// without talking), makes it a multiple of the world size, and deals it out like cards: rank r
// takes positions r, r + W, r + 2W, ... With shuffling off that is samples r, r + W, r + 2W, ...
//
//   n = 10, W = 3, drop_last = false: the order is padded by wrapping around to 12 entries
//     (0..9, 0, 1) -> rank 0: 0 3 6 9   rank 1: 1 4 7 0   rank 2: 2 5 8 1
//   n = 10, W = 3, drop_last = true: the tail is cut to 9 entries
//     -> rank 0: 0 3 6   rank 1: 1 4 7   rank 2: 2 5 8
//
// Every rank gets the same number of samples, hence the same number of batches: a rank with one
// batch more would call the all-reduce of a backward pass the others never run, and the job would
// hang. That is why the order is padded (a few samples count twice) or cut (a few are skipped).
//
// Call set_epoch(e) before each epoch (the DataLoader's set_epoch does): without it every epoch
// repeats the same shuffled order, as in PyTorch.
//
// Shuffled orders are drawn with tinyddp's Philox generator, so they are not the numbers
// torch.randperm draws for the same seed; everything else (sizes, padding, cutting, dealing)
// matches PyTorch index for index.
#pragma once

#include <cstdint>
#include <vector>

#include "tinyddp/nn/data/sampler.h"

namespace tinyddp::nn {

struct DistributedSamplerOptions {
  bool shuffle = true;     // PyTorch's default
  uint64_t seed = 0;       // the order of epoch e is drawn from seed + e; must be the same on every rank
  bool drop_last = false;  // cut the order to a multiple of the world size instead of padding it
};

class DistributedSampler : public Sampler {
 public:
  // dataset_size samples shared among num_replicas ranks; this sampler is rank's share.
  DistributedSampler(int64_t dataset_size, int num_replicas, int rank, DistributedSamplerOptions options = {});

  // This rank's indices for the current epoch.
  std::vector<int64_t> indices() const override;
  // Samples per rank: ceil(n / W), or floor(n / W) with drop_last.
  int64_t size() const override { return num_samples_; }

  // All ranks' shares together: size() * num_replicas().
  int64_t total_size() const { return num_samples_ * num_replicas_; }
  int64_t dataset_size() const { return dataset_size_; }
  int num_replicas() const { return num_replicas_; }
  int rank() const { return rank_; }
  const DistributedSamplerOptions& options() const { return options_; }

 private:
  int64_t dataset_size_;
  int num_replicas_, rank_;
  DistributedSamplerOptions options_;
  int64_t num_samples_;
};

}  // namespace tinyddp::nn
