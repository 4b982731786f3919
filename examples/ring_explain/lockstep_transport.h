// LockstepTransport: an in-memory transport for ring_explain that watches the real ring algorithm
// work, and holds it to one step at a time so the buffers can be printed between steps.
//
// The library's ring (comm/algorithms/ring.cpp) only ever talks to the network through the
// Connection interface of comm/transport/transport.h: try_send, then try_peek + release (receive and reduce
// in place) or try_recv (receive by copying). This transport implements that interface with
// in-memory queues between the threads that act as ranks, and writes down every call: who sent
// which bytes of their buffer, and whether the receiver added them (peek/release) or copied them
// (try_recv). Nothing of the algorithm is re-implemented here; what gets printed is what it did.
//
// Holding it in lockstep uses the transport's right to say "no room, try later": a rank's k-th
// message is refused (try_send returns 0, exactly as a full TCP socket would) until every rank has
// fully received its (k-1)-th message. The real ring pipelines its steps into one another; held
// like this it runs the same schedule, one step after the other, which is what a reader can follow.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "tinyddp/comm/transport/transport.h"

namespace tinyddp::examples {

// One message: the bytes of one try_send call, and where in the sender's buffer they came from.
struct RingMessage {
  int sender = 0;
  size_t byte_offset = 0;  // into the sender's buffer
  std::vector<std::byte> bytes;
  size_t consumed = 0;
};

// What one rank did in one step, as the transport saw it.
struct StepRecord {
  bool sent = false;
  size_t sent_offset = 0, sent_bytes = 0;  // bytes of this rank's buffer it sent to rank+1
  bool received = false;
  size_t received_offset = 0, received_bytes = 0;  // bytes of the sender's buffer that arrived
  bool reduced = false;  // true: taken with try_peek + release (the ring adds); false: try_recv (copies)
};

// The state every rank's transport shares: the queues, the step counter and the records.
class LockstepNetwork {
 public:
  // `buffers[r]` is rank r's buffer (for turning pointers into offsets). `on_step` runs, with every
  // rank held, each time all ranks have received their message of a step.
  LockstepNetwork(std::vector<const std::byte*> buffers, std::function<void(int step)> on_step);

  int world() const { return int(buffers_.size()); }
  // records()[step][rank]
  const std::vector<std::vector<StepRecord>>& records() const { return records_; }

  size_t try_send(int rank, const void* data, size_t n);
  std::span<const std::byte> try_peek(int rank, size_t max);
  void release(int rank, size_t n);
  size_t try_recv(int rank, void* dst, size_t n);
  void sleep_once(std::chrono::microseconds max_sleep);

 private:
  StepRecord& record(int step, int rank);
  // Called with the lock held after rank `rank` consumed a whole message.
  void finish_receive(int rank, const RingMessage& message, bool reduced);

  std::vector<const std::byte*> buffers_;
  std::function<void(int)> on_step_;
  std::mutex mutex_;
  std::condition_variable changed_;
  int open_step_ = 0;                           // ranks may send their message number open_step_
  std::vector<int> sent_;                       // per rank: messages sent
  std::vector<int> received_;                   // per rank: messages fully received
  std::vector<std::deque<RingMessage>> inbox_;  // per rank: messages from rank-1, oldest first
  std::vector<std::vector<StepRecord>> records_;
};

class LockstepTransport;

// One direction of a ring link as the algorithm sees it: rank `rank` sends to `peer` (next) or
// receives from `peer` (prev).
class LockstepConnection : public comm::Connection {
 public:
  LockstepConnection(LockstepTransport& transport, LockstepNetwork& network, int rank, int peer);
  size_t try_send(const void* data, size_t n, size_t granule) override;
  size_t try_recv(void* dst, size_t n) override;
  std::span<const std::byte> try_peek(size_t max) override;
  void release(size_t n) override;

 private:
  LockstepNetwork& network_;
  int rank_;
};

class LockstepTransport : public comm::Transport {
 public:
  explicit LockstepTransport(LockstepNetwork& network) : network_(network) {}
  const char* name() const override { return "lockstep"; }
  comm::Connection* connection(int) override { return nullptr; }  // the ring is given its connections directly
  void sleep_once(std::span<const comm::WaitFor>, std::chrono::microseconds max_sleep) override {
    network_.sleep_once(max_sleep);
  }
  // Threads of one process: none can die alone.
  void check_peers(std::chrono::milliseconds, std::span<const int>) override {}
  void abort(const std::string&) override {}

 private:
  LockstepNetwork& network_;
};

}  // namespace tinyddp::examples
