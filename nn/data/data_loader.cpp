#include "tinyddp/nn/data/data_loader.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "tinyddp/core/error.h"

namespace tinyddp::nn {

// One pass over the data. With prefetch, a worker thread builds the batches in order into `ready_`,
// at most kQueueDepth ahead of the consumer; the consumer takes them from the front. Without
// prefetch, next() builds each batch on the caller's thread.
class DataLoader::Pass {
 public:
  static constexpr size_t kQueueDepth = 2;

  Pass(std::shared_ptr<const Dataset> dataset, std::vector<std::vector<int64_t>> batches, bool prefetch,
       bool pin_memory)
      : dataset_(std::move(dataset)), batches_(std::move(batches)), pin_memory_(pin_memory) {
    if (prefetch && !batches_.empty()) worker_ = std::thread([this] { produce(); });
  }

  // Stops the worker and waits for it: called when the loop ends, breaks early, or unwinds. The worker
  // finishes the batch it is building (a dataset cannot be interrupted midway) and then exits.
  ~Pass() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    space_.notify_all();
    if (worker_.joinable()) worker_.join();
  }

  Pass(const Pass&) = delete;
  Pass& operator=(const Pass&) = delete;

  // Stores the next batch into `out`; false at the end of the pass. Rethrows the exception that
  // building this batch raised.
  bool next(Batch& out) {
    if (consumed_ == batches_.size()) return false;
    const size_t index = consumed_++;
    if (!worker_.joinable()) {
      out = build(batches_[index]);
      return true;
    }
    Slot slot;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      filled_.wait(lock, [&] { return !ready_.empty(); });
      slot = std::move(ready_.front());
      ready_.pop_front();
    }
    space_.notify_one();
    if (slot.error) {
      consumed_ = batches_.size();  // the worker has stopped; the pass ends with this error
      std::rethrow_exception(slot.error);
    }
    out = std::move(slot.batch);
    return true;
  }

 private:
  // A prepared batch, or the exception that preparing it raised.
  struct Slot {
    Batch batch;
    std::exception_ptr error;
  };

  Batch build(const std::vector<int64_t>& indices) const {
    Batch batch = dataset_->get_batch(indices);
    if (pin_memory_) {
      if (batch.inputs.defined()) batch.inputs = batch.inputs.pin_memory();
      if (batch.targets.defined()) batch.targets = batch.targets.pin_memory();
    }
    return batch;
  }

  void produce() {
    for (const std::vector<int64_t>& indices : batches_) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        space_.wait(lock, [&] { return stopping_ || ready_.size() < kQueueDepth; });
        if (stopping_) return;
      }
      // Built outside the lock: this is the work that overlaps the consumer's training step.
      Slot slot;
      try {
        slot.batch = build(indices);
      } catch (...) {
        slot.error = std::current_exception();
      }
      const bool failed = slot.error != nullptr;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        ready_.push_back(std::move(slot));
      }
      filled_.notify_one();
      if (failed) return;
    }
  }

  std::shared_ptr<const Dataset> dataset_;  // shared: the pass may outlive its DataLoader
  const std::vector<std::vector<int64_t>> batches_;
  const bool pin_memory_;
  size_t consumed_ = 0;  // touched by the consumer only

  std::mutex mutex_;
  std::condition_variable filled_;  // a slot was added to ready_
  std::condition_variable space_;   // a slot was taken from ready_, or stopping_ was set
  std::deque<Slot> ready_;
  bool stopping_ = false;
  std::thread worker_;  // last member: started once everything above exists
};

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options,
                       std::shared_ptr<Sampler> sampler)
    : dataset_(std::move(dataset)), options_(options), sampler_(std::move(sampler)) {
  TINYDDP_CHECK(dataset_ != nullptr, "DataLoader: the dataset is null",
                hint("pass std::make_shared<TensorDataset>(...)"));
  TINYDDP_CHECK(options_.batch_size >= 1, "DataLoader: batch_size ", options_.batch_size, " must be at least 1",
                hint("set DataLoaderOptions::batch_size"));
  TINYDDP_CHECK(!(sampler_ && options_.shuffle), "DataLoader: a sampler and shuffle = true were both given",
                hint("the sampler decides the order, so leave shuffle false (a DistributedSampler shuffles itself)"));
  if (!sampler_) {
    if (options_.shuffle)
      sampler_ = std::make_shared<RandomSampler>(dataset_->size(), options_.seed);
    else
      sampler_ = std::make_shared<SequentialSampler>(dataset_->size());
  }
}

int64_t DataLoader::size() const {
  const int64_t n = sampler_->size();
  return options_.drop_last ? n / options_.batch_size : (n + options_.batch_size - 1) / options_.batch_size;
}

DataLoader::Iterator DataLoader::begin() {
  std::vector<int64_t> order = sampler_->indices();
  TINYDDP_CHECK(int64_t(order.size()) == sampler_->size(), "DataLoader: the sampler returned ", order.size(),
                " indices but its size() is ", sampler_->size(), hint("a Sampler's indices() and size() must agree"));
  const size_t batch_size = size_t(options_.batch_size);
  std::vector<std::vector<int64_t>> batches;
  for (size_t begin = 0; begin < order.size(); begin += batch_size) {
    const size_t end = std::min(order.size(), begin + batch_size);
    if (end - begin < batch_size && options_.drop_last) break;
    batches.emplace_back(order.begin() + std::ptrdiff_t(begin), order.begin() + std::ptrdiff_t(end));
  }
  return Iterator(std::make_shared<Pass>(dataset_, std::move(batches), options_.prefetch, options_.pin_memory));
}

DataLoader::Iterator::Iterator(std::shared_ptr<Pass> pass) : pass_(std::move(pass)) { ++*this; }

const Batch& DataLoader::Iterator::operator*() const {
  TINYDDP_CHECK(pass_ != nullptr, "DataLoader: dereferencing an iterator past the last batch",
                hint("compare it with loader.end() first"));
  return current_;
}

DataLoader::Iterator& DataLoader::Iterator::operator++() {
  TINYDDP_CHECK(pass_ != nullptr, "DataLoader: advancing an iterator past the last batch",
                hint("compare it with loader.end() first"));
  std::shared_ptr<Pass> pass = pass_;
  pass_ = nullptr;  // stays at the end if next() finds no more batches or throws
  current_ = Batch{};
  if (pass->next(current_)) pass_ = std::move(pass);
  return *this;
}

}  // namespace tinyddp::nn
