// How a buffer is cut into per-rank chunks: chunk i of `count` elements cut into `parts`. The
// first count % parts chunks get one element more, so the chunks differ by at most one element
// and lie in rank order.
//
// Every algorithm that cuts a buffer into per-rank pieces cuts it this way (the ring, Rabenseifner,
// the single-rounding reductions), and so does whatever must agree with them about which rank ends
// up with which elements: ZeRO's shards (nn/optim/zero_shard.h) are the chunks of a ring
// all-reduce's reduce-scatter.
#pragma once

#include <algorithm>
#include <cstddef>

namespace tinyddp::comm {

// The first element of chunk i (0 <= i <= parts; chunk_begin(count, parts, parts) == count).
inline size_t chunk_begin(size_t count, int parts, int i) {
  const size_t base = count / size_t(parts), extra = count % size_t(parts);
  return size_t(i) * base + std::min(size_t(i), extra);
}

// The number of elements in chunk i.
inline size_t chunk_count(size_t count, int parts, int i) {
  return chunk_begin(count, parts, i + 1) - chunk_begin(count, parts, i);
}

}  // namespace tinyddp::comm
