// DataLoader: cuts a dataset into batches, in the order a sampler gives, and prepares the next batch on
// a background thread while the caller trains on the current one.
//
//   auto data = std::make_shared<TensorDataset>(read_csv("digits.csv.gz", {.feature_scale = 1.f / 16}));
//   DataLoader loader(data, {.batch_size = 64, .shuffle = true, .seed = 42});
//   for (int64_t epoch = 0; epoch < epochs; ++epoch) {
//     loader.set_epoch(epoch);                 // a new order each epoch, the same on every run
//     for (const Batch& batch : loader) { ... batch.inputs.to(device) ... }
//   }
//
// Each range-for (each begin()) starts one pass over the data: it takes the sampler's index list for the
// current epoch and starts a worker thread that builds batches into a queue of at most two. The pass
// belongs to the iterator: leaving the loop early (break, return, an exception) destroys the iterator,
// which stops the worker and joins it, so nothing keeps running and nothing deadlocks. An exception
// thrown while a batch is being built (by the dataset) is rethrown in the caller's thread at the
// point where that batch would have been returned, and the pass ends there.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>

#include "tinyddp/nn/data/dataset.h"
#include "tinyddp/nn/data/sampler.h"

namespace tinyddp::nn {

struct DataLoaderOptions {
  int64_t batch_size = 1;
  bool shuffle = false;    // without a sampler: RandomSampler(seed) when true, SequentialSampler when false
  uint64_t seed = 0;       // the shuffle's seed; the order of epoch e comes from seed + e
  bool drop_last = false;  // drop the last batch when it would be smaller than batch_size
  bool prefetch = true;    // build batches on a background thread (false: on the caller's thread, on demand)
  // Put each batch in pinned memory (Tensor::pin_memory) as it is built, so its copy to a GPU runs at
  // full speed; nothing changes while no CUDA device is in use. PyTorch's pin_memory.
  bool pin_memory = false;
};

class DataLoader {
  class Pass;  // one pass over the data: the batches' index lists, the queue and the worker thread

 public:
  // The dataset is shared, so a pass in progress keeps it alive. A custom sampler (a DistributedSampler)
  // replaces shuffle/seed: passing both a sampler and shuffle = true is an error, as in PyTorch.
  DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options = {},
             std::shared_ptr<Sampler> sampler = nullptr);

  // Marks the end of a pass; compared with an Iterator by the range-for.
  struct End {};

  class Iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;
    using pointer = const Batch*;
    using reference = const Batch&;

    Iterator() = default;
    // The current batch; valid until the iterator is advanced or destroyed.
    const Batch& operator*() const;
    const Batch* operator->() const { return &**this; }
    // Moves to the next batch, waiting for the worker if it is not ready yet; rethrows the worker's
    // exception if building that batch failed.
    Iterator& operator++();
    friend bool operator==(const Iterator& it, End) { return it.pass_ == nullptr; }

   private:
    friend class DataLoader;
    explicit Iterator(std::shared_ptr<Pass> pass);

    std::shared_ptr<Pass> pass_;  // null at the end
    Batch current_;
  };

  // Starts a pass over the current epoch and returns its first batch.
  Iterator begin();
  End end() const { return {}; }

  // Batches per pass.
  int64_t size() const;
  // Selects the epoch of the next pass (the sampler's set_epoch).
  void set_epoch(int64_t epoch) { sampler_->set_epoch(epoch); }

  const Dataset& dataset() const { return *dataset_; }
  Sampler& sampler() { return *sampler_; }
  const DataLoaderOptions& options() const { return options_; }

 private:
  std::shared_ptr<const Dataset> dataset_;
  DataLoaderOptions options_;
  std::shared_ptr<Sampler> sampler_;
};

}  // namespace tinyddp::nn
