#include "tinyddp/comm/algorithms/rabenseifner.h"

#include <cstring>

namespace tinyddp::comm {

namespace {

// Segments [first, first + n) of a buffer of `count` elements cut into `parts`, as bytes.
struct ByteRange {
  size_t offset, bytes;
};
ByteRange segments(size_t count, int parts, int first, int n, size_t elem) {
  const size_t begin = chunk_begin(count, parts, first), end = chunk_begin(count, parts, first + n);
  return {begin * elem, (end - begin) * elem};
}

// Recursive halving: on return, core rank c holds segment c reduced over the core.
void reduce_scatter_by_halving(const PeerGroup& group, const PowerOfTwoCore& core, int c, std::byte* buf, size_t count,
                               const CollectiveContext& ctx) {
  const size_t elem = dtype_size(ctx.dtype);
  int first = 0, width = core.size;  // the window of segments c still works on
  for (int distance = core.size / 2; distance >= 1; distance /= 2) {
    const int partner = c ^ distance, half = width / 2;
    const bool keep_lower = (c & distance) == 0;
    const ByteRange keep = segments(count, core.size, keep_lower ? first : first + half, half, elem);
    const ByteRange give = segments(count, core.size, keep_lower ? first + half : first, half, elem);
    exchange_and_fold(group.peer(core.group_rank(partner)), buf + give.offset, give.bytes, buf + keep.offset,
                      keep.bytes, ctx);
    if (!keep_lower) first += half;
    width = half;
  }
}

// Recursive doubling of the windows: on return every core rank holds every segment.
void all_gather_by_doubling(const PeerGroup& group, const PowerOfTwoCore& core, int c, std::byte* buf, size_t count,
                            const CollectiveContext& ctx) {
  const size_t elem = dtype_size(ctx.dtype);
  for (int distance = 1; distance < core.size; distance *= 2) {
    const int partner = c ^ distance;
    // Before this step each rank holds the `distance` segments of its aligned window.
    const ByteRange mine = segments(count, core.size, c & ~(distance - 1), distance, elem);
    const ByteRange theirs = segments(count, core.size, partner & ~(distance - 1), distance, elem);
    exchange(group.peer(core.group_rank(partner)), buf + mine.offset, mine.bytes, buf + theirs.offset, theirs.bytes,
             ctx);
  }
}

}  // namespace

void rabenseifner_all_reduce(const PeerGroup& group, const std::byte* in, std::byte* out, size_t count,
                             const CollectiveContext& ctx) {
  const size_t elem = dtype_size(ctx.dtype);
  if (out != in && count > 0) std::memmove(out, in, count * elem);
  if (count == 0) return;
  const PowerOfTwoCore core(group.size());
  fold_into_core(group, core, out, count, /*lower_first=*/false, ctx);  // one rank folds each pair: any order agrees
  const int c = core.core_rank(group.rank);
  if (c >= 0) {
    reduce_scatter_by_halving(group, core, c, out, count, ctx);
    if (ctx.op == ReduceOp::avg) {
      const ByteRange mine = segments(count, core.size, c, 1, elem);
      finish_average(out + mine.offset, mine.bytes / elem, ctx.dtype, ctx.world_size);
    }
    all_gather_by_doubling(group, core, c, out, count, ctx);
  }
  unfold_from_core(group, core, out, count, ctx);
}

}  // namespace tinyddp::comm
