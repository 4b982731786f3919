// Samplers: which sample indices an epoch visits, in which order.
//
// The DataLoader asks its sampler for the epoch's index list once, at the start of each epoch, and
// cuts it into batches. Keeping the order in its own object is what lets DDP swap in a
// DistributedSampler that hands each rank its own share of the indices, with no change to the loader.
#pragma once

#include <cstdint>
#include <vector>

namespace tinyddp::nn {

class Sampler {
 public:
  virtual ~Sampler() = default;

  // The indices of the current epoch, in visiting order. The same epoch gives the same list.
  virtual std::vector<int64_t> indices() const = 0;
  // How many indices indices() returns (without building the list).
  virtual int64_t size() const = 0;
  // Selects the epoch the next indices() describes; shuffling samplers draw a new order per epoch.
  virtual void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }

 protected:
  int64_t epoch_ = 0;
};

// 0, 1, ..., n - 1, every epoch.
class SequentialSampler : public Sampler {
 public:
  explicit SequentialSampler(int64_t n);
  std::vector<int64_t> indices() const override;
  int64_t size() const override { return n_; }

 private:
  int64_t n_;
};

// A permutation of 0..n-1 drawn from seed + epoch (as PyTorch's DistributedSampler seeds its
// generator): the same seed and epoch give the same order on every rank and every run, and each
// epoch gets a fresh order once set_epoch is called.
class RandomSampler : public Sampler {
 public:
  RandomSampler(int64_t n, uint64_t seed);
  std::vector<int64_t> indices() const override;
  int64_t size() const override { return n_; }
  uint64_t seed() const { return seed_; }

 private:
  int64_t n_;
  uint64_t seed_;
};

}  // namespace tinyddp::nn
