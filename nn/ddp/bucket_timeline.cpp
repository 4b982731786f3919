#include "tinyddp/nn/ddp/bucket_timeline.h"

#include <nlohmann/json.hpp>

#include <string>

#include "tinyddp/core/trace.h"

namespace tinyddp::nn {

void BucketTimeline::iteration_started(size_t buckets) { launches_.assign(buckets, Launch{}); }

void BucketTimeline::bucket_ready(size_t bucket) {
  if (!trace::enabled()) return;
  trace::record_instant("bucket " + std::to_string(bucket) + " ready", "ddp", trace::Lane::comm,
                        nlohmann::json{{"rank", rank_}, {"bucket", bucket}}.dump());
}

void BucketTimeline::bucket_launched(size_t bucket, const BucketSpec& spec, const comm::WorkPtr& work) {
  if (!trace::enabled()) return;
  if (launches_.size() <= bucket) launches_.resize(bucket + 1);
  launches_[bucket] = {work, trace::now_us(), spec.bytes, spec.parameters.size()};
}

void BucketTimeline::gradient_marked() {
  if (!trace::enabled()) return;
  for (size_t b = 0; b < launches_.size(); ++b)
    if (launches_[b].work && launches_[b].work->is_completed()) record_span(b);
}

void BucketTimeline::bucket_finished(size_t bucket) {
  if (bucket < launches_.size() && launches_[bucket].work) record_span(bucket);
}

void BucketTimeline::record_span(size_t bucket) {
  Launch& launch = launches_[bucket];
  launch.work = nullptr;  // recorded: the span ends at the first look that found it complete
  if (!trace::enabled()) return;
  trace::record_span(
      "all_reduce bucket " + std::to_string(bucket), "ddp", trace::Lane::comm, launch.at_us, trace::now_us(),
      nlohmann::json{{"rank", rank_}, {"bucket", bucket}, {"bytes", launch.bytes}, {"parameters", launch.parameters}}
          .dump());
}

}  // namespace tinyddp::nn
