// BucketPlan: which parameters' gradients travel together in one all-reduce, and in which order.
//
// All-reducing every gradient on its own would pay the per-message latency once per parameter;
// all-reducing everything as one message at the end of backward would leave the network idle
// while backward runs. DDP sits in between: gradients are grouped into buckets of a few MiB, in the
// order backward produces them, so that as soon as the last layer's gradients are done, their
// bucket can go on the wire while backward keeps computing the earlier layers.
//
// The rule is PyTorch's (compute_bucket_assignment_by_size in its reducer, the path it takes when it
// rebuilds buckets from the order gradients became ready): walk the parameters in the expected ready
// order and add each to the open bucket; as soon as the bucket holds at least its size limit, close
// it and open the next one. The first bucket's limit is small (1 MiB by default) so the first
// all-reduce starts early; every later bucket's limit is the cap (25 MiB by default). A bucket
// therefore exceeds its limit by at most its last parameter, and one parameter larger than the cap
// gets a bucket of its own. Parameters inside a bucket keep the walk's order, which is also their
// layout in the bucket's flat buffer.
//
// This file is pure arithmetic on sizes, so the assignment can be tested alone (test_bucket_plan).
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <vector>

namespace tinyddp::nn {

// PyTorch's defaults: dist._DEFAULT_FIRST_BUCKET_BYTES and DistributedDataParallel(bucket_cap_mb=25).
constexpr size_t kDefaultFirstBucketBytes = size_t(1) << 20;
constexpr size_t kDefaultBucketCapBytes = size_t(25) << 20;

struct BucketSpec {
  std::vector<size_t> parameters;  // parameter indices (registration order numbers), in layout order
  size_t bytes = 0;                // sum of the parameters' gradient sizes
  size_t size_limit = 0;           // the limit that applied while this bucket was filled
};

// Buckets in launch order. `order` lists every parameter index once, in the order the gradients are
// expected to become ready; parameter_bytes[i] is parameter i's gradient size in bytes. Throws when
// `order` is not a permutation of 0..parameter_bytes.size()-1 or a limit is zero.
std::vector<BucketSpec> plan_buckets(std::span<const size_t> order, std::span<const size_t> parameter_bytes,
                                     size_t first_bucket_bytes = kDefaultFirstBucketBytes,
                                     size_t bucket_cap_bytes = kDefaultBucketCapBytes);

// n-1, n-2, ..., 0: the order to expect before anything was observed. Layers register their
// parameters in forward order and backward runs the layers in reverse, so the last registered
// parameters are ready first.
std::vector<size_t> reverse_registration_order(size_t count);

// A table for people: one line per bucket with its bytes and its parameters' names, e.g.
//   bucket 0: 4.0 MiB (4235304 bytes, limit 1.0 MiB): 4.bias, 4.weight, 2.bias, 2.weight
std::string describe_buckets(const std::vector<BucketSpec>& buckets, const std::vector<std::string>& names);

}  // namespace tinyddp::nn
