#include "tinyddp/comm/algorithms/collective_engine.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <thread>

#include "tinyddp/core/env.h"
#include "tinyddp/core/error.h"

namespace tinyddp::comm {

namespace {

using Clock = std::chrono::steady_clock;

// Where large streams start in a page of a transport's buffer (tuning::kStreamPhase); another
// phase may be asked for, to measure it. Read on first use, so a bad value fails a collective.
size_t stream_phase() {
  static const size_t phase = env::unsigned_integer("TINYDDP_STREAM_PHASE", 0, 4095).value_or(tuning::kStreamPhase);
  return phase;
}

struct Progress {
  size_t send_total = 0, recv_total = 0;
  size_t sent = 0, processed = 0;
  size_t send_region = 0, send_offset = 0;
  size_t recv_region = 0, recv_offset = 0;
  size_t next_post = 0;  // copy regions from this index on were not offered to post_recv yet
  ElementReader reader;
};

}  // namespace

CollectiveWaiter::CollectiveWaiter(const CollectiveContext& ctx)
    : ctx_(ctx), spin_(ctx.wait.spin), last_progress_(spin_.started_at()) {}

void CollectiveWaiter::progressed() {
  last_progress_ = Clock::now();
  spin_.reset(last_progress_);
}

void CollectiveWaiter::wait(const std::vector<WaitFor>& waits) {
  if (spin_.keep_spinning()) {
    // The first microseconds spin on the CPU; after that, unless this rank has a core of its
    // own, each retry yields the core first, so a peer that shares it gets to run and answer.
    if (ctx_.wait.yield_while_spinning && spin_.past(ctx_.wait.pure_spin)) std::this_thread::yield();
    SpinThenSleep::pause();
    return;
  }
  std::map<Transport*, std::vector<WaitFor>> by_transport;
  for (const WaitFor& w : waits) by_transport[&w.connection->transport()].push_back(w);
  auto slice = by_transport.size() > 1 ? tuning::kMixedSleepSlice : tuning::kSleepSlice;
  for (auto& [transport, list] : by_transport) transport->sleep_once(list, slice);
  auto now = Clock::now();
  auto stalled = std::chrono::duration_cast<std::chrono::milliseconds>(now - last_progress_);
  std::vector<int> awaited;
  for (const WaitFor& w : waits) awaited.push_back(w.connection->peer());
  for (Transport* t : ctx_.transports) t->check_peers(stalled, awaited);
  if (now > ctx_.deadline) fail_timeout(waits);
}

void CollectiveWaiter::fail_timeout(const std::vector<WaitFor>& waits) const {
  std::string from, to;
  for (const WaitFor& w : waits) {
    if (w.recv) from += (from.empty() ? "" : ", ") + std::to_string(w.connection->peer());
    if (w.send) to += (to.empty() ? "" : ", ") + std::to_string(w.connection->peer());
  }
  std::string waiting;
  if (!from.empty()) waiting += "to receive from rank(s) " + from;
  if (!to.empty()) waiting += (waiting.empty() ? "" : " and ") + std::string("to send to rank(s) ") + to;
  TINYDDP_FAIL(ctx_.what(), ": timed out after ", ctx_.timeout.count(), " ms waiting ", waiting,
               hint("those ranks did not make the same collective call (run with TINYDDP_DEBUG=DETAIL to check "
                    "that every rank calls the same collectives), are stuck elsewhere, or need a longer timeout"));
}

namespace {

// Sends what the dependency rule allows, at most one turn's bytes per call: one thread drives both
// directions, and a long send (a TCP send() of megabytes, the kernel copying it all) would leave
// the incoming direction idle meanwhile. Returns whether any byte moved.
bool pump_send(Stream& s, Progress& p, size_t elem) {
  bool moved = false;
  size_t budget = s.to->bytes_per_turn();
  while (p.sent < p.send_total && budget > 0) {
    size_t allowed = std::min(std::min(s.send_lead + p.processed, p.send_total) - p.sent, budget);
    if (allowed == 0) break;
    const SendRegion& region = s.send[p.send_region];
    size_t n = std::min(region.bytes - p.send_offset, allowed);
    size_t took = s.to->try_send(region.data + p.send_offset, n, elem);
    if (took == 0) break;
    moved = true;
    budget -= std::min(budget, took);
    p.sent += took;
    p.send_offset += took;
    while (p.send_region < s.send.size() && p.send_offset == s.send[p.send_region].bytes) {
      ++p.send_region;
      p.send_offset = 0;
    }
  }
  return moved;
}

// Whether this rank has sent every byte it sends out of the memory [dst, dst + bytes) before that
// memory is received into: only then may a transport's receiver thread write there. (The peer's
// bytes for a place depend on what this rank sent from it, so they could not arrive earlier anyway;
// but that order is kept by the network, and this one by the code, where a reader and
// ThreadSanitizer can see it.) An in-place 2-rank all-reduce first sends the half its all-gather
// later receives into. Send bytes that depend on the received bytes themselves (a ring forwarding
// what it received: send byte i waits for receive byte i - send_lead) leave after the receive by
// construction and do not count. `stream_offset` is where dst[0] comes in the receive stream.
bool sent_everything_from(const Stream& s, const Progress& p, const std::byte* dst, size_t bytes,
                          size_t stream_offset) {
  const auto begin = reinterpret_cast<uintptr_t>(dst), end = begin + bytes;
  const size_t after_receive = s.send_lead + stream_offset;  // send bytes from here on wait for the receive
  size_t send_begin = 0;                                     // where each send region starts in the send stream
  for (const SendRegion& send : s.send) {
    const auto data = reinterpret_cast<uintptr_t>(send.data);
    const uintptr_t lo = std::max(data, begin), hi = std::min(data + send.bytes, end);
    if (lo < hi) {  // this region sends [lo, hi) of that memory from these stream offsets:
      const size_t first = send_begin + size_t(lo - data),
                   last = std::min(send_begin + size_t(hi - data), after_receive);
      if (first < last && p.sent < last) return false;
    }
    send_begin += send.bytes;
  }
  return true;
}

// Offers the transport the next copy region of the receive stream (Connection::post_recv), once
// the one offered before is behind the consumer, even while regions before it are still being
// reduced: in a 2-rank all-reduce the peer's all-gather bytes start to arrive while this rank
// still reduces, and posted early they go straight to the caller's buffer instead of the
// transport's own buffer.
// A region the consumer has already begun (its sends were not done in time) is offered for what
// is left of it.
void offer_next_copy_region(Stream& s, Progress& p) {
  size_t start = p.processed - p.recv_offset;  // where the current region starts in the stream
  for (size_t j = p.recv_region; j < s.recv.size(); start += s.recv[j].bytes, ++j) {
    const RecvRegion& region = s.recv[j];
    if (region.own != nullptr) continue;
    const size_t done = j == p.recv_region ? p.recv_offset : 0;
    if (!sent_everything_from(s, p, region.dst + done, region.bytes - done, start + done))
      return;  // asked again next turn
    // The transport counts from the bytes released so far: the processed ones and any part of an
    // element the reader holds in its carry.
    s.from->post_recv(region.dst + done, region.bytes - done, start + done - (p.processed + p.reader.carry_bytes));
    p.next_post = j + 1;
    return;
  }
  p.next_post = s.recv.size() + 1;  // none left
}

// Receives, reduces or copies up to one turn's bytes; returns whether any byte moved.
bool pump_recv(Stream& s, Progress& p, const CollectiveContext& ctx, size_t elem) {
  bool moved = false;
  size_t budget = s.from->bytes_per_turn();
  while (p.processed < p.recv_total && budget > 0) {
    if (p.next_post <= p.recv_region) offer_next_copy_region(s, p);
    const RecvRegion& region = s.recv[p.recv_region];
    size_t want = std::min(region.bytes - p.recv_offset, budget);
    size_t n = 0;
    if (region.own == nullptr) {
      n = s.from->try_recv(region.dst + p.recv_offset, want);
    } else {
      n = p.reader.take(*s.from, want, elem, [&](const std::byte* theirs, size_t count) {
        reduce_elements(region.dst + p.recv_offset, region.own + p.recv_offset, theirs, count, ctx.dtype, ctx.op);
      });
    }
    if (n == 0) break;
    if (region.average && region.own != nullptr)
      finish_average(region.dst + p.recv_offset, n / elem, ctx.dtype, ctx.world_size);
    moved = true;
    budget -= std::min(budget, n);
    p.processed += n;
    p.recv_offset += n;
    while (p.recv_region < s.recv.size() && p.recv_offset == s.recv[p.recv_region].bytes) {
      ++p.recv_region;
      p.recv_offset = 0;
    }
  }
  return moved;
}

void drop_empty_regions(Stream& s) {
  std::erase_if(s.send, [](const SendRegion& r) { return r.bytes == 0; });
  std::erase_if(s.recv, [](const RecvRegion& r) { return r.bytes == 0; });
}

}  // namespace

void run_streams(std::span<Stream> streams, const CollectiveContext& ctx) {
  const size_t elem = dtype_size(ctx.dtype);
  const size_t phase = stream_phase();
  std::vector<Progress> progress(streams.size());
  for (size_t i = 0; i < streams.size(); ++i) {
    drop_empty_regions(streams[i]);
    for (auto& r : streams[i].send) progress[i].send_total += r.bytes;
    for (auto& r : streams[i].recv) progress[i].recv_total += r.bytes;
    // The peer's run_streams sees the same totals for the same bytes, so both ends align alike.
    if (progress[i].send_total >= tuning::kAlignedStreamBytes) streams[i].to->align_send(phase);
    if (progress[i].recv_total >= tuning::kAlignedStreamBytes) streams[i].from->align_recv(phase);
  }
  // However this ends, no transport may go on writing into a region posted below.
  struct CancelPosts {
    std::span<Stream> streams;
    ~CancelPosts() {
      for (Stream& s : streams)
        if (s.from) s.from->cancel_recv();
    }
  } cancel_posts{streams};
  CollectiveWaiter waiter(ctx);
  std::vector<WaitFor> waits;
  for (;;) {
    bool moved = false, done = true;
    for (size_t i = 0; i < streams.size(); ++i) {
      Stream& s = streams[i];
      Progress& p = progress[i];
      if (p.sent < p.send_total) moved |= pump_send(s, p, elem);
      if (p.processed < p.recv_total) {
        moved |= pump_recv(s, p, ctx, elem);
        if (p.sent < p.send_total) moved |= pump_send(s, p, elem);  // what was just reduced can go on at once
      }
      done &= p.sent == p.send_total && p.processed == p.recv_total;
    }
    if (done) return;
    if (moved) {
      waiter.progressed();
      continue;
    }
    waits.clear();
    for (size_t i = 0; i < streams.size(); ++i) {
      Progress& p = progress[i];
      bool send_blocked = p.sent < std::min(streams[i].send_lead + p.processed, p.send_total);
      bool recv_pending = p.processed < p.recv_total;
      if (send_blocked) waits.push_back({streams[i].to, true, false});
      if (recv_pending) waits.push_back({streams[i].from, false, true});
    }
    waiter.wait(waits);
  }
}

}  // namespace tinyddp::comm
