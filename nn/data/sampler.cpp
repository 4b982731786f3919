#include "tinyddp/nn/data/sampler.h"

#include <numeric>

#include "tinyddp/core/error.h"
#include "tinyddp/core/random.h"

namespace tinyddp::nn {

SequentialSampler::SequentialSampler(int64_t n) : n_(n) {
  TINYDDP_CHECK(n >= 0, "SequentialSampler: negative size ", n, hint("pass the dataset's size()"));
}

std::vector<int64_t> SequentialSampler::indices() const {
  std::vector<int64_t> order(static_cast<size_t>(n_));
  std::iota(order.begin(), order.end(), int64_t(0));
  return order;
}

RandomSampler::RandomSampler(int64_t n, uint64_t seed) : n_(n), seed_(seed) {
  TINYDDP_CHECK(n >= 0, "RandomSampler: negative size ", n, hint("pass the dataset's size()"));
}

std::vector<int64_t> RandomSampler::indices() const {
  // A fresh generator per call: the order depends on (seed, epoch) only, not on how often it was asked.
  Generator generator(seed_ + uint64_t(epoch_));
  return random_permutation(n_, generator);
}

}  // namespace tinyddp::nn
