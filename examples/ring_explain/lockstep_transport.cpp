#include "lockstep_transport.h"

#include <algorithm>
#include <cstring>

#include "tinyddp/core/error.h"

namespace tinyddp::examples {

LockstepNetwork::LockstepNetwork(std::vector<const std::byte*> buffers, std::function<void(int)> on_step)
    : buffers_(std::move(buffers)),
      on_step_(std::move(on_step)),
      sent_(buffers_.size()),
      received_(buffers_.size()),
      inbox_(buffers_.size()) {}

StepRecord& LockstepNetwork::record(int step, int rank) {
  if (records_.size() <= size_t(step)) records_.resize(size_t(step) + 1, std::vector<StepRecord>(buffers_.size()));
  return records_[size_t(step)][size_t(rank)];
}

size_t LockstepNetwork::try_send(int rank, const void* data, size_t n) {
  std::lock_guard lock(mutex_);
  // The rank's next message belongs to a step the others have not finished: "no room yet".
  if (sent_[size_t(rank)] > open_step_) return 0;
  auto* first = static_cast<const std::byte*>(data);
  RingMessage message{rank, size_t(first - buffers_[size_t(rank)]), std::vector<std::byte>(first, first + n), 0};
  StepRecord& r = record(sent_[size_t(rank)]++, rank);
  r.sent = true;
  r.sent_offset = message.byte_offset;
  r.sent_bytes = n;
  inbox_[size_t((rank + 1) % world())].push_back(std::move(message));
  changed_.notify_all();
  return n;
}

std::span<const std::byte> LockstepNetwork::try_peek(int rank, size_t max) {
  std::lock_guard lock(mutex_);
  auto& inbox = inbox_[size_t(rank)];
  if (inbox.empty()) return {};
  // A deque keeps its elements in place while others are pushed behind them, so the span stays
  // valid until release() drops the message.
  const RingMessage& m = inbox.front();
  return {m.bytes.data() + m.consumed, std::min(max, m.bytes.size() - m.consumed)};
}

void LockstepNetwork::release(int rank, size_t n) {
  std::lock_guard lock(mutex_);
  RingMessage& m = inbox_[size_t(rank)].front();
  m.consumed += n;
  if (m.consumed < m.bytes.size()) return;
  RingMessage done = std::move(m);
  inbox_[size_t(rank)].pop_front();
  finish_receive(rank, done, true);
}

size_t LockstepNetwork::try_recv(int rank, void* dst, size_t n) {
  std::lock_guard lock(mutex_);
  auto& inbox = inbox_[size_t(rank)];
  if (inbox.empty()) return 0;
  RingMessage& m = inbox.front();
  size_t take = std::min(n, m.bytes.size() - m.consumed);
  std::memcpy(dst, m.bytes.data() + m.consumed, take);
  m.consumed += take;
  if (m.consumed == m.bytes.size()) {
    RingMessage done = std::move(m);
    inbox.pop_front();
    finish_receive(rank, done, false);
  }
  return take;
}

void LockstepNetwork::finish_receive(int rank, const RingMessage& message, bool reduced) {
  StepRecord& r = record(received_[size_t(rank)]++, rank);
  r.received = true;
  r.received_offset = message.byte_offset;
  r.received_bytes = message.bytes.size();
  r.reduced = reduced;
  // Every rank has its message of the open step: the step is over. Everyone is held here (their
  // next sends are refused), so the buffers can be read while nothing writes them.
  if (*std::min_element(received_.begin(), received_.end()) > open_step_) {
    on_step_(open_step_);
    ++open_step_;
  }
  changed_.notify_all();
}

void LockstepNetwork::sleep_once(std::chrono::microseconds max_sleep) {
  std::unique_lock lock(mutex_);
  changed_.wait_for(lock, max_sleep);
}

LockstepConnection::LockstepConnection(LockstepTransport& transport, LockstepNetwork& network, int rank, int peer)
    : comm::Connection(transport, peer), network_(network), rank_(rank) {}

size_t LockstepConnection::try_send(const void* data, size_t n, size_t) { return network_.try_send(rank_, data, n); }
size_t LockstepConnection::try_recv(void* dst, size_t n) { return network_.try_recv(rank_, dst, n); }
std::span<const std::byte> LockstepConnection::try_peek(size_t max) { return network_.try_peek(rank_, max); }
void LockstepConnection::release(size_t n) { network_.release(rank_, n); }

}  // namespace tinyddp::examples
