#include "tinyddp/comm/algorithms/symmetric_all_reduce.h"

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "tinyddp/comm/chunks.h"
#include "tinyddp/comm/symmetric/symmetric_buffer.h"
#include "tinyddp/comm/transport/shm_transport.h"
#include "tinyddp/core/error.h"
#include "tinyddp/core/short_list.h"

namespace tinyddp::comm {

namespace {

using Clock = std::chrono::steady_clock;

// The steps of one collective on a buffer: its progress counters advance by kSteps per collective.
constexpr uint64_t kArrived = 1, kDone = 2, kSteps = 2;

const char* step_name(uint64_t step) {
  return step % kSteps == kArrived % kSteps ? "to arrive at this collective (their data ready)"
                                            : "to finish reducing their slices into every rank's part";
}

// The ranks whose counters have not reached `step`.
std::vector<int> behind(const SymmetricBuffer& b, uint64_t step) {
  std::vector<int> late;
  for (int p = 0; p < b.parties(); ++p)
    if (p != b.position() && !b.reached(p, step)) late.push_back(b.ranks()[size_t(p)]);
  return late;
}

bool all_reached(const SymmetricBuffer& b, uint64_t step) {
  for (int p = 0; p < b.parties(); ++p)
    if (p != b.position() && !b.reached(p, step)) return false;
  return true;
}

}  // namespace

void symmetric_barrier(SymmetricBuffer& b, uint64_t step, ShmTransport& shm, const CollectiveContext& ctx) {
  b.publish(step);
  // The first look at the peers goes before the wake-up: its loads then travel while this rank's step
  // does, where after the wake's fence they would wait for it.
  const bool reached = all_reached(b, step);
  shm.wake_local_peers();
  if (reached) return;
  SpinThenSleep spin(ctx.wait.spin);
  while (!all_reached(b, step)) {
    if (spin.keep_spinning()) {
      if (ctx.wait.yield_while_spinning && spin.past(ctx.wait.pure_spin)) std::this_thread::yield();
      SpinThenSleep::pause();
      continue;
    }
    shm.sleep_until([&] { return all_reached(b, step); }, tuning::kSleepSlice);
    // A peer that arrives may pass this barrier and exit before this rank looks again (when it is
    // the last call of a program): what a rank published before it went counts, so the steps are
    // read again after any peer is found gone, and only a rank still behind then has failed. Nobody
    // passes before every rank has arrived, so all having arrived settles it.
    if (all_reached(b, step)) return;
    const auto now = Clock::now();
    const auto stalled = std::chrono::duration_cast<std::chrono::milliseconds>(now - spin.started_at());
    const std::vector<int> late = behind(b, step);
    try {
      for (Transport* t : ctx.transports) t->check_peers(stalled, late);
      for (int r : late) shm.check_peer(r, stalled);
    } catch (const Error&) {
      if (all_reached(b, step)) return;
      throw;
    }
    if (now > ctx.deadline && !late.empty())
      TINYDDP_FAIL(ctx.what(), ": timed out after ", ctx.timeout.count(), " ms waiting for rank(s) ",
                   short_list(late, 8, [](int r) { return std::to_string(r); }), " ", step_name(step),
                   " on symmetric buffer #", b.index(),
                   hint("those ranks did not make the same collective call (every rank must call the collectives "
                        "on its tensor of the symmetric allocation, in the same order), are stuck elsewhere, or need a "
                        "longer timeout"));
  }
}

void check_same_call(const SymmetricBuffer& b, const SymmetricCall& mine, uint64_t step, const CollectiveContext& ctx,
                     bool same_op) {
  for (int p = 0; p < b.parties(); ++p) {
    if (p == b.position()) continue;
    SymmetricCall theirs = b.call_of(p, step);
    theirs.address = mine.address;
    if (!same_op) theirs.op = mine.op;
    if (theirs == mine) continue;
    TINYDDP_FAIL(ctx.what(), ": rank ", b.ranks()[size_t(p)], " is in collective #", theirs.sequence, " on ",
                 theirs.count, " elements of ", dtype_name(DType(theirs.dtype)), " at byte ", theirs.offset,
                 " of symmetric buffer #", b.index(), " (", reduce_op_name(ReduceOp(theirs.op)), "), this rank in #",
                 mine.sequence, " on ", mine.count, " elements of ", dtype_name(DType(mine.dtype)), " at byte ",
                 mine.offset, " (", reduce_op_name(ReduceOp(mine.op)), ")",
                 hint("every rank must make the same collective calls on the same tensors of a symmetric allocation"));
  }
}

void reduce_symmetric_slice(const SymmetricBuffer& b, size_t at, size_t count, const CollectiveContext& ctx,
                            bool push_to_peers) {
  const size_t elem = dtype_size(ctx.dtype);
  const int n = b.parties(), me = b.position();
  const size_t block = std::max<size_t>(1, tuning::kSymmetricReduceBlockBytes / elem);
  for (size_t done = 0; done < count; done += block) {
    const size_t k = std::min(block, count - done), where = at + done * elem;
    std::byte* own = b.data() + where;
    if (!push_to_peers || n == 1) {
      for (int step = 1; step < n; ++step)
        reduce_elements(own, own, b.data_of((me + step) % n) + where, k, ctx.dtype, ctx.op);
      if (ctx.op == ReduceOp::avg) finish_average(own, k, ctx.dtype, ctx.world_size);
      continue;
    }
    fold_block_and_push(b, own, own, where, k, ctx);
  }
}

void fold_block_and_push(const SymmetricBuffer& b, const std::byte* mine, std::byte* out, size_t at, size_t count,
                         const CollectiveContext& ctx) {
  const int n = b.parties(), me = b.position();
  const size_t elem = dtype_size(ctx.dtype);
  const std::byte* acc = mine;
  for (int step = 1; step < n - 1; ++step) {
    reduce_elements(out, acc, b.data_of((me + step) % n) + at, count, ctx.dtype, ctx.op);
    acc = out;
  }
  if (acc != out) std::memcpy(out, acc, count * elem);
  // The last peer's block is added and written back in one pass (its lines come over once, not
  // once to be read and again to be written); the other peers get a copy of the finished block.
  reduce_elements_into_both(out, b.data_of((me + n - 1) % n) + at, count, ctx.dtype, ctx.op, ctx.world_size);
  for (int step = 1; step < n - 1; ++step) std::memcpy(b.data_of((me + step) % n) + at, out, count * elem);
}

uint64_t arrive_at_call(SymmetricBuffer& b, const SymmetricCall& call, ShmTransport& shm,
                        const CollectiveContext& ctx) {
  TINYDDP_CHECK(b.peers_mapped(), ctx.what(), ": symmetric buffer #", b.index(),
                " no longer maps its peers' parts (its process group ended)",
                hint("use the group it was allocated from"));
  const uint64_t base = b.my_step();
  b.set_call(base + kArrived, call);
  symmetric_barrier(b, base + kArrived, shm, ctx);
  check_same_call(b, call, base + kArrived, ctx);
  return base;
}

void depart_from_call(SymmetricBuffer& b, uint64_t base, ShmTransport& shm, const CollectiveContext& ctx) {
  symmetric_barrier(b, base + kDone, shm, ctx);
}

void fold_as_ring_reduce_scatter(const SymmetricBuffer& b, size_t at, size_t count, std::byte* out,
                                 const CollectiveContext& ctx) {
  const size_t elem = dtype_size(ctx.dtype);
  const int n = b.parties(), me = b.position();
  const size_t block = std::max<size_t>(1, tuning::kSymmetricReduceBlockBytes / elem);
  thread_local std::vector<std::byte> partial;
  for (size_t done = 0; done < count; done += block) {
    const size_t k = std::min(block, count - done), where = at + done * elem;
    const std::byte* own = b.data() + where;
    std::byte* dst = out + done * elem;
    if (n == 1) {
      if (dst != own) std::memcpy(dst, own, k * elem);
      continue;
    }
    const std::byte* first = b.data_of((me + 1) % n) + where;
    if (n == 2) {  // x_(me+1) op x_me, elementwise: in place too
      reduce_elements(dst, first, own, k, ctx.dtype, ctx.op);
      continue;
    }
    // The peers' partial goes where it cannot overwrite x_me before x_me is added last.
    std::byte* acc = dst;
    if (dst == own) {
      if (partial.size() < block * elem) partial.resize(block * elem);
      acc = partial.data();
    }
    reduce_elements(acc, first, b.data_of((me + 2) % n) + where, k, ctx.dtype, ctx.op);
    for (int step = 3; step < n; ++step)
      reduce_elements(acc, acc, b.data_of((me + step) % n) + where, k, ctx.dtype, ctx.op);
    reduce_elements(dst, acc, own, k, ctx.dtype, ctx.op);
  }
}

void symmetric_all_reduce(SymmetricBuffer& b, size_t offset, size_t count, ShmTransport& shm,
                          const CollectiveContext& ctx) {
  const int n = b.parties(), me = b.position();
  const size_t elem = dtype_size(ctx.dtype);
  const uint64_t base =
      arrive_at_call(b, SymmetricCall{offset, count, uint32_t(ctx.dtype), uint32_t(ctx.op), ctx.sequence}, shm, ctx);

  // Nobody else reads or writes slice `me` of any part until the done barrier (each rank reads only
  // its own slice of the others), so the pushes race with nothing.
  reduce_symmetric_slice(b, offset + chunk_begin(count, n, me) * elem, chunk_count(count, n, me), ctx,
                         /*push_to_peers=*/true);
  depart_from_call(b, base, shm, ctx);
}

}  // namespace tinyddp::comm
