// BucketTimeline: the gradient buckets on the trace's communication lane (core/trace.h).
//
// It watches a Reducer (Reducer::Observer) and, while tracing is on, records what a reader of the
// timeline needs to see the overlap DDP exists for:
//
//   "bucket 0 ready"        an instant: the bucket's last gradient was marked ready
//   "all_reduce bucket 0"   a span, from the moment its all-reduce was launched to the first moment
//                           the backward thread saw it complete (the communication thread does not
//                           call back, so the end is an upper bound on the true completion)
//
// DistributedDataParallel gives its Reducer one; while tracing is off it records nothing and costs
// a check per event. The Reducer itself knows nothing of traces.
#pragma once

#include <cstdint>
#include <vector>

#include "tinyddp/nn/ddp/reducer.h"

namespace tinyddp::nn {

class BucketTimeline : public Reducer::Observer {
 public:
  explicit BucketTimeline(int rank) : rank_(rank) {}

  void iteration_started(size_t buckets) override;
  void bucket_ready(size_t bucket) override;
  void bucket_launched(size_t bucket, const BucketSpec& spec, const comm::WorkPtr& work) override;
  void gradient_marked() override;
  void bucket_finished(size_t bucket) override;

 private:
  struct Launch {
    comm::WorkPtr work;  // null: not launched in this iteration, or its span is recorded already
    int64_t at_us = 0;
    size_t bytes = 0, parameters = 0;
  };
  void record_span(size_t bucket);

  int rank_;
  std::vector<Launch> launches_;  // by bucket, for the iteration in progress
};

}  // namespace tinyddp::nn
