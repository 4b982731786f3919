// ZeRO's shard of one DDP bucket: which elements of the bucket's flat layout this rank owns, and
// where each rank's part sits in the reduce-scatter and all-gather that move them.
//
// The layout is chosen so that ZeRO's reduce-scatter adds every gradient element in exactly the
// order DDP's ring all-reduce adds it, which makes ZeRO's averaged gradients (and so its weights)
// bitwise equal to DDP's. The ring all-reduce (comm/algorithms/ring.h) cuts a bucket of
// `count` elements into `world` chunks with chunk_begin (the first count % world chunks one element
// longer), and its reduce-scatter phase finishes chunk c on rank c-1, having added the ranks'
// values in the order c, c+1, ..., c-1. The reduce-scatter collective takes equal parts instead
// ("slots" of ceil(count / world) elements) and finishes slot j on rank j in the order j+1, ..., j.
// So slot j must carry the all-reduce's chunk j+1:
//
//   staging (world * slot elements):  | chunk 1 + pad | chunk 2 + pad | ... | chunk 0 + pad |
//                                        slot 0          slot 1                slot world-1
//
// and rank r owns chunk (r+1) % world -- the very chunk the all-reduce's first phase leaves on it.
// The padding is zeros, which the sums leave zero.
#pragma once

#include <cstdint>
#include <vector>

#include "tinyddp/core/tensor.h"

namespace tinyddp::nn {

struct ShardLayout {
  int64_t count = 0;  // elements in the bucket
  int world = 1, rank = 0;
  int64_t slot = 0;   // each rank's part of the collectives: ceil(count / world), padded
  int64_t begin = 0;  // this rank's elements: [begin, begin + length) of the bucket's flat layout
  int64_t length = 0;

  // The all-reduce chunk that slot j carries.
  int chunk_in_slot(int j) const { return (j + 1) % world; }
  int64_t chunk_begin(int chunk) const;
  int64_t chunk_length(int chunk) const;
};

ShardLayout shard_layout(int64_t count, int world, int rank);

// Where a bucket's parameters sit in its flat layout (GradBucket's offsets and lengths).
struct BucketPlaces {
  std::vector<size_t> parameters;  // indices (registration order), layout order
  std::vector<int64_t> offsets, lengths;
};

// Copies elements [flat_begin, flat_begin + flat.numel()) of the bucket's flat layout between the
// contiguous `flat` and `per_parameter` (one tensor per bucket parameter, in layout order, each with
// that parameter's element count): into `flat` when to_flat, else out of it.
void copy_flat_range(const BucketPlaces& places, int64_t flat_begin, const Tensor& flat,
                     const std::vector<Tensor>& per_parameter, bool to_flat);

// staging's slot j = chunk (j+1) of `bucket` (padding untouched): the reduce-scatter's input.
void pack_slots(const ShardLayout& layout, const Tensor& bucket, const Tensor& staging);
// The inverse for a result gathered in `staging`: every chunk written to its place in `per_parameter`.
void unpack_slots(const ShardLayout& layout, const BucketPlaces& places, const Tensor& staging,
                  const std::vector<Tensor>& per_parameter);

}  // namespace tinyddp::nn
