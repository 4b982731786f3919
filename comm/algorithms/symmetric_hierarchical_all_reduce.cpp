#include "tinyddp/comm/algorithms/symmetric_hierarchical_all_reduce.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "tinyddp/comm/algorithms/symmetric_all_reduce.h"
#include "tinyddp/comm/reduce_op.h"
#include "tinyddp/comm/symmetric/symmetric_buffer.h"

namespace tinyddp::comm {

void symmetric_hierarchical_all_reduce(SymmetricBuffer& b, size_t offset, size_t count, ShmTransport& shm,
                                       const PeerGroup& across, GroupAllReduce across_hosts,
                                       const CollectiveContext& ctx) {
  const int L = b.parties(), me = b.position();
  const size_t elem = dtype_size(ctx.dtype);
  // The FIFO version's parts: count rounded up to a multiple of L, part j the j-th L-th of it. Past
  // `count` a part is padding, which only the cross-host step sees.
  const size_t part = (count + size_t(L) - 1) / size_t(L);
  const size_t mine_begin = std::min(count, size_t(me) * part);
  const size_t mine = std::min(count, mine_begin + part) - mine_begin;
  std::byte* my_part = b.data() + offset + mine_begin * elem;
  // The parts are summed; an average divides once, after the cross-host step.
  CollectiveContext summing = ctx;
  if (ctx.op == ReduceOp::avg) summing.op = ReduceOp::sum;

  const uint64_t base =
      arrive_at_call(b, SymmetricCall{offset, count, uint32_t(ctx.dtype), uint32_t(ctx.op), ctx.sequence}, shm, ctx);

  fold_as_ring_reduce_scatter(b, offset + mine_begin * elem, mine, my_part, summing);
  if (mine == part) {
    across_hosts(across, my_part, my_part, part, summing);
  } else {
    thread_local std::vector<std::byte> padded;
    padded.assign(part * elem, std::byte{0});
    if (mine > 0) std::memcpy(padded.data(), my_part, mine * elem);
    across_hosts(across, padded.data(), padded.data(), part, summing);
    if (mine > 0) std::memcpy(my_part, padded.data(), mine * elem);
  }
  if (ctx.op == ReduceOp::avg) finish_average(my_part, mine, ctx.dtype, ctx.world_size);
  if (mine > 0)
    for (int step = 1; step < L; ++step)
      std::memcpy(b.data_of((me + step) % L) + offset + mine_begin * elem, my_part, mine * elem);
  depart_from_call(b, base, shm, ctx);
}

}  // namespace tinyddp::comm
