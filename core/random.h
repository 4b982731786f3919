// Random numbers that are the same on every device and every run for one seed.
//
// A Generator is (seed, offset). Each fill consumes ceil(n / 4) Philox blocks and advances the offset,
// so successive fills draw fresh numbers, and recreating a Generator with the same seed replays them.
#pragma once

#include <cstdint>
#include <vector>

#include "tinyddp/core/tensor.h"

namespace tinyddp {

class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}
  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }
  // Reserves the counter range for `count` numbers and returns where it starts.
  uint64_t advance(uint64_t count) {
    uint64_t start = offset_;
    offset_ += (count + 3) / 4;
    return start;
  }

  // One uniform float in [0, 1), or an integer in [0, n), drawn on the CPU (for shuffling).
  float next_float();
  uint64_t next_below(uint64_t n);

 private:
  uint64_t seed_;
  uint64_t offset_ = 0;
};

// Fills an f32 tensor (CPU or CUDA) with uniform numbers in [lo, hi).
void fill_uniform(Tensor& t, float lo, float hi, Generator& gen);
// A random permutation of 0..n-1 (Fisher-Yates), the same for one generator state.
std::vector<int64_t> random_permutation(int64_t n, Generator& gen);

}  // namespace tinyddp
