#include "tinyddp/comm/algorithms/slot_all_reduce.h"

#include <cstring>

#include "tinyddp/comm/algorithms/symmetric_all_reduce.h"
#include "tinyddp/comm/symmetric/symmetric_buffer.h"
#include "tinyddp/core/error.h"

namespace tinyddp::comm {

size_t slot_capacity(const SymmetricBuffer& slots) { return slots.bytes() / 2; }

void slot_all_reduce(SymmetricBuffer& slots, const std::byte* in, std::byte* out, size_t count, ShmTransport& shm,
                     const CollectiveContext& ctx) {
  const size_t bytes = count * dtype_size(ctx.dtype), capacity = slot_capacity(slots);
  TINYDDP_CHECK(bytes <= capacity, ctx.what(), ": ", bytes, " bytes do not fit a slot of ", capacity, " bytes",
                hint("this is a bug in the caller"));
  TINYDDP_CHECK(slots.peers_mapped(), ctx.what(), ": the slots no longer map the peers' parts (the group ended)",
                hint("use a process group that is still open"));
  const int n = slots.parties();
  const uint64_t step = slots.my_step() + 1;
  const size_t slot = (step & 1) * capacity;

  if (bytes > 0) std::memcpy(slots.data() + slot, in, bytes);  // an empty tensor's data may be null
  const SymmetricCall call{0, count, uint32_t(ctx.dtype), uint32_t(ctx.op), ctx.sequence};
  slots.set_call(step, call);
  symmetric_barrier(slots, step, shm, ctx);
  check_same_call(slots, call, step, ctx, /*same_op=*/false);

  if (bytes == 0) return;
  // In rank order, every rank alike: the first two slots are combined straight into `out`, with no copy first.
  if (n == 1)
    std::memcpy(out, slots.data_of(0) + slot, bytes);
  else
    reduce_elements(out, slots.data_of(0) + slot, slots.data_of(1) + slot, count, ctx.dtype, ctx.op);
  for (int p = 2; p < n; ++p) reduce_elements(out, out, slots.data_of(p) + slot, count, ctx.dtype, ctx.op);
  if (ctx.op == ReduceOp::avg) finish_average(out, count, ctx.dtype, ctx.world_size);
}

}  // namespace tinyddp::comm
