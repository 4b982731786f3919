// The collective engine: what every algorithm of the host backend runs on (the ring, the direct
// exchange, recursive doubling, Rabenseifner, the hierarchical ones).
//
// An algorithm describes, for each peer it talks to, two byte streams: the regions it sends out and
// the regions it receives into (copying, or reducing into its own data), and how far the send
// stream may run ahead of the receive stream (a ring forwards what it has received and reduced;
// a plain exchange sends everything at once). run_streams() then moves every stream to the end.
//
// Pipelining. A send byte may leave as soon as the received byte it depends on has arrived and
// been reduced (Stream::send_lead). run_streams() moves every stream a turn's worth of bytes at a
// time with non-blocking transport calls, so at any moment one piece is on the wire out, another on
// the wire in, and a third being reduced: in a ring (ring.h), steps overlap steps, not just pieces
// inside a step.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "tinyddp/comm/chunks.h"
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
  const Work* work = nullptr;  // the collective's Work: its description names it in messages
  uint64_t sequence = 0;       // the collective's number in its group
  const char* phase = "";      // appended to the description in messages
  DType dtype = DType::f32;
  ReduceOp op = ReduceOp::sum;
  int world_size = 1;
  std::chrono::milliseconds timeout{0};
  std::chrono::steady_clock::time_point deadline;
  WaitPolicy wait;  // the process group's
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

// ---- the streams ----
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

// Moves every stream to completion from this thread; throws on timeout or a peer failure.
void run_streams(std::span<Stream> streams, const CollectiveContext& ctx);

}  // namespace tinyddp::comm
