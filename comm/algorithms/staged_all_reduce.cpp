#include "tinyddp/comm/algorithms/staged_all_reduce.h"

#include <algorithm>
#include <cstring>

#include "tinyddp/comm/algorithms/symmetric_all_reduce.h"
#include "tinyddp/comm/chunks.h"
#include "tinyddp/comm/symmetric/symmetric_buffer.h"
#include "tinyddp/comm/tuning.h"
#include "tinyddp/core/error.h"

namespace tinyddp::comm {

namespace {

// Two steps a round on the staging buffer's progress counters.
constexpr uint64_t kArrived = 1, kReduced = 2, kSteps = 2;

}  // namespace

void staged_all_reduce(SymmetricBuffer& staging, const std::byte* in, std::byte* out, size_t count, ShmTransport& shm,
                       const CollectiveContext& ctx) {
  TINYDDP_CHECK(staging.peers_mapped(), ctx.what(), ": the staging buffer no longer maps the peers' parts",
                hint("use a process group that is still open"));
  const int n = staging.parties(), me = staging.position();
  const size_t elem = dtype_size(ctx.dtype), half = staging.bytes() / 2;
  // Each round takes `window` elements of every rank's slice: n windows fill a half.
  const size_t window = std::max<size_t>(1, half / elem / size_t(n));
  const size_t largest_slice = chunk_count(count, n, 0);  // chunk 0 is never smaller than the others
  const size_t rounds = std::max<size_t>(1, (largest_slice + window - 1) / window);
  const size_t block = std::max<size_t>(1, tuning::kSymmetricReduceBlockBytes / elem);
  const SymmetricCall call{0, count, uint32_t(ctx.dtype), uint32_t(ctx.op), ctx.sequence};

  for (size_t j = 0; j < rounds; ++j) {
    const uint64_t base = staging.my_step();
    const size_t at = ((base / kSteps) & 1) * half;  // the round's half, by its number's parity
    const size_t first = j * window;                 // the window's first element within each slice
    auto window_of = [&](int q) {                    // slice q's part of this round: [begin, begin + count)
      const size_t slice = chunk_count(count, n, q), begin = std::min(first, slice);
      return std::pair{chunk_begin(count, n, q) + begin, std::min(window, slice - begin)};
    };
    // Where slot q starts in every rank's part: the rank's window of slice q, until rank q overwrites
    // it with the reduced window.
    auto slot_at = [&](int q) { return at + size_t(q) * window * elem; };

    for (int step = 1; step < n; ++step) {
      const int q = (me + step) % n;
      const auto [begin, k] = window_of(q);
      std::memcpy(staging.data() + slot_at(q), in + begin * elem, k * elem);
    }
    if (j == 0) {
      staging.set_call(base + kArrived, call);
      symmetric_barrier(staging, base + kArrived, shm, ctx);
      check_same_call(staging, call, base + kArrived, ctx, /*same_op=*/false);
    } else {
      symmetric_barrier(staging, base + kArrived, shm, ctx);
    }

    // x_me (straight from the input), x_(me+1), ... as the ring folds, a cache-sized block at a time,
    // each finished block pushed into every peer's slot me while it is in cache.
    const auto [my_begin, my_k] = window_of(me);
    for (size_t done = 0; done < my_k; done += block) {
      const size_t k = std::min(block, my_k - done);
      fold_block_and_push(staging, in + (my_begin + done) * elem, out + (my_begin + done) * elem,
                          slot_at(me) + done * elem, k, ctx);
    }
    symmetric_barrier(staging, base + kReduced, shm, ctx);

    // Every peer q has written its reduced window of slice q into this rank's slot q.
    for (int step = 1; step < n; ++step) {
      const int q = (me + step) % n;
      const auto [begin, k] = window_of(q);
      std::memcpy(out + begin * elem, staging.data() + slot_at(q), k * elem);
    }
  }
}

}  // namespace tinyddp::comm
