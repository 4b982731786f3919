#include "tinyddp/comm/algorithms/recursive_doubling.h"

#include <cstring>
#include <vector>

namespace tinyddp::comm {

void recursive_doubling_all_reduce(const PeerGroup& group, const std::byte* in, std::byte* out, size_t count,
                                   const CollectiveContext& ctx) {
  const size_t bytes = count * dtype_size(ctx.dtype);
  if (out != in && bytes > 0) std::memmove(out, in, bytes);
  if (bytes == 0) return;
  const PowerOfTwoCore core(group.size());
  // The partner's buffer of each step: the thread's own, reused (no allocation per call).
  thread_local std::vector<std::byte> theirs;
  if (theirs.size() < bytes) theirs.resize(bytes);

  fold_into_core(group, core, out, count, /*lower_first=*/true, ctx);
  const int c = core.core_rank(group.rank);
  if (c >= 0) {
    for (int distance = 1; distance < core.size; distance *= 2) {
      const int partner = c ^ distance;
      exchange(group.peer(core.group_rank(partner)), out, bytes, theirs.data(), bytes, ctx);
      fold_in_rank_order(out, theirs.data(), c < partner, count, ctx);
    }
    if (ctx.op == ReduceOp::avg) finish_average(out, count, ctx.dtype, ctx.world_size);
  }
  unfold_from_core(group, core, out, count, ctx);
}

}  // namespace tinyddp::comm
