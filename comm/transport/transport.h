// Transport: how bytes move between two ranks, and how a rank waits for them.
//
// A Connection is a full-duplex byte stream to one peer. The algorithms (algorithms/collective_engine.h) drive
// several of them from a single thread with non-blocking calls: send what fits, take what has
// arrived, reduce it, repeat. Sending, receiving and reducing therefore overlap without a thread
// per direction, and when nothing can move the thread waits on the transport (spin, then sleep).
//
// Two implementations:
//   TcpConnection (tcp_transport.h)  any two hosts; the kernel copies the bytes twice
//   ShmConnection (shm_transport.h)  ranks on one host; a fifo in shared memory, and the receiver
//                                    reduces straight out of the sender's fifo
//
// Receiving has two forms because the two transports are good at different things:
//   try_recv(dst, n)   copies into the destination
//   try_peek / release looks at the bytes where they already are (shared memory: in the peer's
//                      fifo; TCP: in the inbox its receiver thread fills), so a reduction reads
//                      them in place.
// and a copy region can be posted first (post_recv), so a transport with a receiver thread puts
// the bytes there itself and try_recv only counts them.
#pragma once

#include <chrono>
#include <cstddef>
#include <span>
#include <string>

#include "tinyddp/comm/tuning.h"

namespace tinyddp::comm {

class Transport;

class Connection {
 public:
  Connection(Transport& transport, int peer) : transport_(&transport), peer_(peer) {}
  virtual ~Connection() = default;
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  int peer() const { return peer_; }
  Transport& transport() const { return *transport_; }

  // Every call below returns at once. Each throws a tinyddp::Error naming the peer when the
  // connection is broken (the peer died, aborted or closed).

  // Queues up to `n` bytes; returns how many were taken (0 when there is no room). A transport
  // that buffers in whole elements takes a multiple of `granule` bytes.
  virtual size_t try_send(const void* data, size_t n, size_t granule) = 0;
  // Receives up to `n` bytes into `dst`; returns how many arrived.
  virtual size_t try_recv(void* dst, size_t n) = 0;
  // Up to `max` received, not yet released bytes, where they already are (empty: none yet).
  virtual std::span<const std::byte> try_peek(size_t max) = 0;
  // Drops the first `n` peeked bytes.
  virtual void release(size_t n) = 0;

  // Where the next collective's bytes start in a transport's buffer. A transport that keeps the
  // stream in a fifo of its own (shared memory) may skip ahead so that they start at `phase` bytes
  // past a 4 KiB boundary; both ends call these at the same point of the stream (the start of a
  // large collective), so they skip the same bytes. Why: a fifo position that trails the caller's
  // buffer by a few dozen bytes modulo 4 KiB makes every reduction's loads wait on its own earlier
  // stores (4K aliasing), and the position otherwise depends on every small collective that went
  // before (tuning::kStreamPhase).
  virtual void align_send(size_t /*phase*/) {}
  virtual void align_recv(size_t /*phase*/) {}

  // The `n` bytes of the stream that follow its next `skip` unreleased bytes are for `dst`, and
  // will be taken with try_recv(dst + i, ...) in order. A transport that receives on a thread of
  // its own (TCP) may then put them there itself, as they arrive, sparing try_recv a copy out of
  // its inbox. Posting ahead (skip > 0, while the bytes before are still being reduced) lets the
  // peer's early bytes go straight there too. One post at a time; it ends by itself once try_recv
  // has taken its last byte. cancel_recv() ends it early; after it returns nothing is written to
  // `dst` any more (call it before `dst` may go away).
  virtual void post_recv(std::byte* /*dst*/, size_t /*n*/, size_t /*skip*/ = 0) {}
  virtual void cancel_recv() {}

  // The most bytes the algorithms move on this connection in one turn: one send, or one receive
  // and reduce, before they look at the other direction (tuning::kBytesPerTurn and its siblings).
  virtual size_t bytes_per_turn() const { return tuning::kBytesPerTurn; }

 private:
  Transport* transport_;
  int peer_;
};

// What a blocked algorithm waits for on one connection.
struct WaitFor {
  Connection* connection;
  bool send;  // room to send
  bool recv;  // bytes to receive
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const = 0;  // "tcp", "shm"
  // The connection to `peer`, or nullptr when this transport does not reach it.
  virtual Connection* connection(int peer) = 0;
  // Sleeps until one of `waits` (all on this transport) may be able to move, or `max_sleep` passed.
  virtual void sleep_once(std::span<const WaitFor> waits, std::chrono::microseconds max_sleep) = 0;
  // Throws an error naming a peer this transport knows to be dead or aborted. `stalled_for` is how
  // long the caller has made no progress: a hint that a hang-up seen earlier was no clean exit.
  // `awaited`: the ranks the caller waits for now. A peer that closed its group or hung up counts
  // only among them: a rank that finished its part of the last collective may close and exit while
  // the others still wait for each other.
  virtual void check_peers(std::chrono::milliseconds stalled_for, std::span<const int> awaited) = 0;
  // Marks this rank failed so that every peer's next wait ends with an error naming `reason`.
  virtual void abort(const std::string& reason) = 0;
};

}  // namespace tinyddp::comm
