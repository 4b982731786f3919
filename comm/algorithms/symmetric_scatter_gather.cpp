#include "tinyddp/comm/algorithms/symmetric_scatter_gather.h"

#include <cstring>

#include "tinyddp/comm/algorithms/symmetric_all_reduce.h"
#include "tinyddp/comm/reduce_op.h"
#include "tinyddp/comm/symmetric/symmetric_buffer.h"

namespace tinyddp::comm {

void symmetric_reduce_scatter(SymmetricBuffer& b, size_t offset, size_t count, std::byte* out, ShmTransport& shm,
                              const CollectiveContext& ctx) {
  const size_t elem = dtype_size(ctx.dtype);
  const uint64_t base =
      arrive_at_call(b, SymmetricCall{offset, count, uint32_t(ctx.dtype), uint32_t(ctx.op), ctx.sequence}, shm, ctx);
  fold_as_ring_reduce_scatter(b, offset + size_t(b.position()) * count * elem, count, out, ctx);
  if (ctx.op == ReduceOp::avg) finish_average(out, count, ctx.dtype, ctx.world_size);
  depart_from_call(b, base, shm, ctx);
}

void symmetric_all_gather(SymmetricBuffer& b, size_t offset, size_t count, const std::byte* in, ShmTransport& shm,
                          const CollectiveContext& ctx) {
  const size_t bytes = count * dtype_size(ctx.dtype), at = offset + size_t(b.position()) * bytes;
  const uint64_t base =
      arrive_at_call(b, SymmetricCall{offset, count, uint32_t(ctx.dtype), uint32_t(ctx.op), ctx.sequence}, shm, ctx);
  if (bytes > 0) {
    if (b.data() + at != in) std::memmove(b.data() + at, in, bytes);
    for (int step = 1; step < b.parties(); ++step)
      std::memcpy(b.data_of((b.position() + step) % b.parties()) + at, in, bytes);
  }
  depart_from_call(b, base, shm, ctx);
}

}  // namespace tinyddp::comm
