// Ring algorithms: reduce-scatter, all-gather, all-reduce and a chained broadcast, pipelined.
//
// The ranks form a ring (r sends to r+1, receives from r-1). The buffer is cut into one chunk per
// rank. All-reduce is reduce-scatter followed by all-gather:
//
//   reduce-scatter, n-1 steps: in step s, rank r sends chunk (r-s) and adds the chunk (r-s-1) it
//     receives into its own; after n-1 steps rank r holds chunk (r+1) summed over every rank.
//   all-gather, n-1 steps: the finished chunks travel once more around the ring and are copied.
//
// Every rank sends and receives 2(n-1)/n of the buffer, whatever n is: that is the "bus
// bandwidth" factor nccl-tests reports, and why the ring is bandwidth-optimal.
//
// Pipelining. Look at what one rank sends: chunk r, then each chunk it received, once reduced.
// So the whole collective is two byte streams per rank, one out to r+1 and one in from r-1, where
// the out-stream is "my first chunk, then the in-stream (reduced) minus its last chunk". A byte
// may leave as soon as the byte it depends on has arrived and been reduced. run_streams() moves
// both streams a turn's worth of bytes at a time with non-blocking transport calls, so at any
// moment one piece is on the wire out, another on the wire in, and a third being reduced: steps
// overlap steps, not just pieces inside a step.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "tinyddp/comm/reduce_op.h"
#include "tinyddp/comm/transport/transport.h"
#include "tinyddp/comm/wait_policy.h"
#include "tinyddp/comm/work.h"
#include "tinyddp/core/dtype.h"

namespace tinyddp::comm {

// What every algorithm needs to know besides the data: element type and op, a name for error
// messages, when to give up, how to wait, and every transport of the group (to notice any dead peer).
// Cheap to copy: the names are only turned into text when an error needs them.
struct CollectiveContext {
  int rank = 0;
  const Work* work = nullptr;                 // the collective's Work: its description names it in messages
  const char* phase = "";                     // appended to the description in messages
  DType dtype = DType::f32;
  ReduceOp op = ReduceOp::sum;
  int world_size = 1;
  std::chrono::milliseconds timeout{0};
  std::chrono::steady_clock::time_point deadline;
  WaitPolicy wait;                            // the process group's
  std::span<Transport* const> transports;

  // "rank 0: all_reduce #3 f32 x1024 sum", for messages.
  std::string what() const {
    return "rank " + std::to_string(rank) + ": " + (work ? work->description() : std::string("collective")) + phase;
  }
};

// Spin, then sleep on the transports, checking every peer and the deadline between sleeps: how
// every blocked algorithm waits. progressed() after any byte moved restarts the spin.
class CollectiveWaiter {
 public:
  explicit CollectiveWaiter(const CollectiveContext& ctx);
  void progressed();
  // Spins once, or sleeps once on the transports of `waits`; throws on a dead peer or the deadline.
  void wait(const std::vector<WaitFor>& waits);

 private:
  [[noreturn]] void fail_timeout(const std::vector<WaitFor>& waits) const;

  const CollectiveContext& ctx_;
  SpinThenSleep spin_;
  int spins_ = 0;
  std::chrono::steady_clock::time_point last_progress_;
};

// Incoming bytes to be reduced, taken whole elements at a time where they lie in the transport
// (try_peek), and through `carry` for the one element that the end of a transport's circular
// buffer cuts in two: after traffic in a smaller dtype (an odd count of i32s, then f64s) the
// stream's position in that buffer is no multiple of the element size, and no peek can ever show
// that element whole.
struct ElementReader {
  alignas(8) std::array<std::byte, 8> carry{};
  size_t carry_bytes = 0;

  // Calls fold(bytes, elements) on up to `max` bytes that have arrived from `from`, releases them,
  // and returns how many bytes it took (0: none now).
  template <typename Fold>
  size_t take(Connection& from, size_t max, size_t elem, Fold&& fold) {
    max -= max % elem;
    if (max == 0) return 0;
    if (carry_bytes == 0) {
      auto piece = from.try_peek(max);
      size_t n = piece.size() - piece.size() % elem;
      if (n > 0) {
        fold(piece.data(), n / elem);
        from.release(n);
        return n;
      }
      if (piece.empty()) return 0;
    }
    carry_bytes += from.try_recv(carry.data() + carry_bytes, elem - carry_bytes);
    if (carry_bytes < elem) return 0;
    fold(carry.data(), size_t(1));
    carry_bytes = 0;
    return elem;
  }
};

// ---- the stream engine ----
struct SendRegion {
  const std::byte* data;
  size_t bytes;
};
// dst = own (op) incoming when `own` is set, else dst = incoming. With `average`, the reduced
// bytes are divided by the world size before they count as processed (and so before they are sent).
struct RecvRegion {
  std::byte* dst;
  const std::byte* own;
  size_t bytes;
  bool average = false;
};
// One peer's pair of streams. Send byte i may leave once send_lead + (bytes processed from the
// receive stream) > i: send_lead = everything for a plain send, the first chunk for a ring.
struct Stream {
  Connection* to = nullptr;
  std::vector<SendRegion> send;
  size_t send_lead = 0;
  Connection* from = nullptr;
  std::vector<RecvRegion> recv;
};

// Chunk i of a buffer of `count` elements cut into `parts`: the first count % parts chunks get one
// more element. Every algorithm that cuts a buffer into per-rank pieces cuts it this way.
size_t chunk_begin(size_t count, int parts, int i);
size_t chunk_count(size_t count, int parts, int i);

// Moves every stream to completion from this thread; throws on timeout or a peer failure.
void run_streams(std::span<Stream> streams, const CollectiveContext& ctx);

// ---- ring collectives (byte pointers; counts in elements of ctx.dtype) ----
struct Ring {
  int rank;
  int size;
  Connection* next;  // to rank (rank+1) % size
  Connection* prev;  // from rank (rank-1+size) % size
};

// out = in reduced over every rank. `out` may be `in`.
void ring_all_reduce(const Ring& ring, const std::byte* in, std::byte* out, size_t count, const CollectiveContext& ctx);
// out (count_per_rank) = chunk `rank` of in (size * count_per_rank), reduced over every rank.
void ring_reduce_scatter(const Ring& ring, const std::byte* in, std::byte* out, size_t count_per_rank,
                         const CollectiveContext& ctx);
// out (size * count_per_rank) = every rank's in, in rank order. `in` may be out's own slot.
void ring_all_gather(const Ring& ring, const std::byte* in, std::byte* out, size_t count_per_rank,
                     const CollectiveContext& ctx);
// buf (count elements, cut into chunks as chunk_begin / chunk_count cut them) on every rank = chunk i
// of rank i's buf, for every i: each rank's own chunk, gathered in place.
void ring_all_gather_chunks(const Ring& ring, std::byte* buf, size_t count, const CollectiveContext& ctx);
// buf on every rank = buf on `root`; a pipelined chain root -> root+1 -> ... (bytes, not elements).
void chain_broadcast(const Ring& ring, std::byte* buf, size_t bytes, int root, const CollectiveContext& ctx);

}  // namespace tinyddp::comm
