#include "tinyddp/nn/data/distributed_sampler.h"

#include <numeric>

#include "tinyddp/core/error.h"
#include "tinyddp/core/random.h"

namespace tinyddp::nn {

DistributedSampler::DistributedSampler(int64_t dataset_size, int num_replicas, int rank,
                                       DistributedSamplerOptions options)
    : dataset_size_(dataset_size), num_replicas_(num_replicas), rank_(rank), options_(options) {
  TINYDDP_CHECK(dataset_size >= 0, "DistributedSampler: negative data set size ", dataset_size,
                hint("pass the dataset's size()"));
  TINYDDP_CHECK(num_replicas >= 1, "DistributedSampler: num_replicas is ", num_replicas,
                hint("pass the world size (the process group's size())"));
  TINYDDP_CHECK(rank >= 0 && rank < num_replicas, "DistributedSampler: rank ", rank, " is outside [0, ", num_replicas,
                ")", hint("pass this process's rank, from 0 to num_replicas - 1"));
  // PyTorch: drop_last and an uneven split -> ceil((n - W) / W), which is floor(n / W); otherwise ceil(n / W).
  num_samples_ = options.drop_last ? dataset_size / num_replicas : (dataset_size + num_replicas - 1) / num_replicas;
}

std::vector<int64_t> DistributedSampler::indices() const {
  // 1. The epoch's order over the whole data set, identical on every rank.
  std::vector<int64_t> order;
  if (options_.shuffle) {
    // A fresh generator per call: the order depends on (seed, epoch) only.
    Generator generator(options_.seed + uint64_t(epoch_));
    order = random_permutation(dataset_size_, generator);
  } else {
    order.resize(size_t(dataset_size_));
    std::iota(order.begin(), order.end(), int64_t(0));
  }

  // 2. Make its length total_size(): pad by wrapping around to the start (as many times as needed
  //    when there are fewer samples than ranks), or cut the tail.
  const size_t total = size_t(total_size());
  if (order.size() < total) {
    const size_t n = order.size();
    for (size_t i = 0; order.size() < total; ++i) order.push_back(order[i % n]);
  } else {
    order.resize(total);
  }

  // 3. Deal it out: this rank takes every num_replicas-th entry, starting at its rank.
  std::vector<int64_t> mine;
  mine.reserve(size_t(num_samples_));
  for (size_t i = size_t(rank_); i < total; i += size_t(num_replicas_)) mine.push_back(order[i]);
  return mine;
}

}  // namespace tinyddp::nn
