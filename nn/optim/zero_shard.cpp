#include "tinyddp/nn/optim/zero_shard.h"

#include <algorithm>

#include "tinyddp/comm/chunks.h"
#include "tinyddp/core/error.h"

namespace tinyddp::nn {

int64_t ShardLayout::chunk_begin(int chunk) const { return int64_t(comm::chunk_begin(size_t(count), world, chunk)); }
int64_t ShardLayout::chunk_length(int chunk) const { return int64_t(comm::chunk_count(size_t(count), world, chunk)); }

ShardLayout shard_layout(int64_t count, int world, int rank) {
  TINYDDP_CHECK(world >= 1 && rank >= 0 && rank < world && count >= 0, "shard_layout: rank ", rank, " of ", world,
                " for ", count, " elements", hint("0 <= rank < world and a non-negative count"));
  ShardLayout layout;
  layout.count = count;
  layout.world = world;
  layout.rank = rank;
  layout.slot = (count + world - 1) / world;
  const int owned = layout.chunk_in_slot(rank);
  layout.begin = layout.chunk_begin(owned);
  layout.length = layout.chunk_length(owned);
  return layout;
}

void copy_flat_range(const BucketPlaces& places, int64_t flat_begin, const Tensor& flat,
                     const std::vector<Tensor>& per_parameter, bool to_flat) {
  const int64_t flat_end = flat_begin + flat.numel();
  for (size_t k = 0; k < places.parameters.size(); ++k) {
    const int64_t lo = std::max(flat_begin, places.offsets[k]);
    const int64_t hi = std::min(flat_end, places.offsets[k] + places.lengths[k]);
    if (lo >= hi) continue;
    Tensor in_flat = flat.view(lo - flat_begin, {hi - lo});
    Tensor in_parameter = per_parameter[k].view(lo - places.offsets[k], {hi - lo});
    if (to_flat)
      in_flat.copy_from(in_parameter);
    else
      in_parameter.copy_from(in_flat);
  }
}

void pack_slots(const ShardLayout& layout, const Tensor& bucket, const Tensor& staging) {
  for (int j = 0; j < layout.world; ++j) {
    const int chunk = layout.chunk_in_slot(j);
    const int64_t length = layout.chunk_length(chunk);
    if (length == 0) continue;
    staging.view(j * layout.slot, {length}).copy_from(bucket.view(layout.chunk_begin(chunk), {length}));
  }
}

void unpack_slots(const ShardLayout& layout, const BucketPlaces& places, const Tensor& staging,
                  const std::vector<Tensor>& per_parameter) {
  for (int j = 0; j < layout.world; ++j) {
    const int chunk = layout.chunk_in_slot(j);
    const int64_t length = layout.chunk_length(chunk);
    if (length == 0) continue;
    copy_flat_range(places, layout.chunk_begin(chunk), staging.view(j * layout.slot, {length}), per_parameter, false);
  }
}

}  // namespace tinyddp::nn
