#include "tinyddp/comm/transport/tcp_transport.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <thread>

#include "tinyddp/comm/transport/tcp_address.h"
#include "tinyddp/comm/transport/tcp_setup.h"
#include "tinyddp/core/error.h"
#include "tinyddp/core/process.h"

namespace tinyddp::comm {

namespace {

using Clock = std::chrono::steady_clock;

// How long a rank may make no progress after some peer hung up before it calls that a failure
// (a peer that exited cleanly after its last collective also hangs up, and must not be blamed).
constexpr auto kHangupGrace = std::chrono::milliseconds(1000);

}  // namespace

// ---- one peer: a socket to send on, and a socket a receiver thread drains into an inbox ----
//
// Why a thread: one thread that alternates non-blocking send() and recv() leaves the incoming
// socket undrained while it sends (and the reverse), and loopback TCP then keeps stalling on full
// windows; a blocking recv() on a thread of its own keeps the window open
// (../../docs/results.md#the-tcp-receiver-thread). The communication thread reads the
// inbox as it reads a shared-memory fifo (peek, reduce in place, release), and sleeps on an eventfd
// the receiver writes to when bytes arrive.
class TcpTransport::TcpConnection : public Connection {
 public:
  TcpConnection(TcpTransport& transport, int peer, int send_fd, int recv_fd)
      : Connection(transport, peer),
        send_fd_(send_fd),
        recv_fd_(recv_fd),
        inbox_memory_(new std::byte[tuning::kTcpInboxBytes]),
        inbox_(inbox_memory_.get(), tuning::kTcpInboxBytes) {
    // The receiver blocks in recv(): its socket must be blocking (the send socket is not).
    ::fcntl(recv_fd_, F_SETFL, ::fcntl(recv_fd_, F_GETFL) & ~O_NONBLOCK);
    receiver_ = std::thread([this] { receive_loop(); });
  }
  ~TcpConnection() override {
    stopping_.store(true);
    ::shutdown(recv_fd_, SHUT_RDWR);  // wakes the receiver out of recv()
    {
      std::lock_guard<std::mutex> lock(room_mutex_);
      room_.notify_all();
    }
    receiver_.join();
    ::close(send_fd_);
    ::close(recv_fd_);
  }
  int send_fd() const { return send_fd_; }
  int recv_fd() const { return recv_fd_; }
  // This rank is aborting: the receiver stops without reporting the peer as gone.
  void stop_receiving() { stopping_.store(true); }
  bool available() const { return written_.load(std::memory_order_acquire) > read_ || closed_.load(); }
  // Bytes that arrived and are not consumed yet (for the communication thread, which consumes).
  bool has_unread() const { return written_.load(std::memory_order_acquire) > read_; }

  size_t try_send(const void* data, size_t n, size_t /*granule*/) override {
    if (n == 0) return 0;
    ssize_t k = ::send(send_fd_, data, n, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (k >= 0) return size_t(k);
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
    owner().fail_connection(peer(), "sending failed: " + errno_text(errno));
  }

  size_t try_recv(void* dst, size_t n) override {
    size_t got = 0;
    while (got < n) {
      // Bytes from direct_from_ on went straight to the posted destination (see post_recv): they
      // are in place already, and only counted here. direct_from_ is stored before written_ moves
      // past it, so the acquire load of written_ makes it visible.
      uint64_t written = written_.load(std::memory_order_acquire);
      uint64_t from = direct_from_.load(std::memory_order_relaxed);
      if (from != kNone && read_ >= from && read_ < written) {
        size_t k = size_t(std::min<uint64_t>(written - read_, n - got));
        got += k;
        release(k);
        continue;
      }
      // Inbox bytes only, and only those known to be inbox bytes by this snapshot: once the receiver
      // starts putting bytes in place, written_ moves on past slots of the inbox it never wrote.
      uint64_t inbox_end = from != kNone && from > read_ ? std::min(from, written) : written;
      size_t want = size_t(std::min<uint64_t>(n - got, inbox_end - std::min(inbox_end, read_)));
      if (want == 0) {
        if (written == read_) try_peek(1);  // nothing arrived: only to report a closed connection
        break;
      }
      auto piece = try_peek(want);
      if (piece.empty()) break;
      std::memcpy(static_cast<std::byte*>(dst) + got, piece.data(), piece.size());
      got += piece.size();
      release(piece.size());
    }
    if (direct_dst_ != nullptr && read_ >= direct_end_) cancel_recv();  // the post is complete
    return got;
  }

  void post_recv(std::byte* dst, size_t n, size_t skip) override {
    if (n < tuning::kTcpPostBytes) return;  // a copy out of the inbox costs less than the bookkeeping
    std::lock_guard<std::mutex> lock(direct_mutex_);
    direct_dst_ = dst;
    direct_begin_ = read_ + skip;
    direct_end_ = direct_begin_ + n;
    direct_posted_.store(true, std::memory_order_release);
  }

  size_t bytes_per_turn() const override { return tuning::kBytesPerTurnTcp; }

  void cancel_recv() override {
    if (!direct_posted_.load(std::memory_order_acquire)) return;
    std::lock_guard<std::mutex> lock(direct_mutex_);  // waits out a receive into direct_dst_
    direct_dst_ = nullptr;
    direct_posted_.store(false, std::memory_order_release);
    direct_from_.store(kNone, std::memory_order_relaxed);
  }

  std::span<const std::byte> try_peek(size_t max) override {
    uint64_t written = written_.load(std::memory_order_acquire);
    if (written == read_ && closed_.load(std::memory_order_acquire)) owner().fail_connection(peer(), close_reason_);
    // Only inbox bytes: from the first byte put in a posted destination on, the inbox's slots were
    // never written (the consumer reads those with try_recv, which counts them).
    uint64_t from = direct_from_.load(std::memory_order_relaxed);
    if (from != kNone && from > read_) written = std::min(written, from);
    size_t at = read_ % inbox_.size();
    size_t n = std::min({size_t(written - read_), inbox_.size() - at, max});
    return {inbox_.data() + at, n};
  }

  void release(size_t n) override {
    read_ += n;
    read_published_.store(read_, std::memory_order_release);
    if (receiver_waiting_.load(std::memory_order_seq_cst)) {
      std::lock_guard<std::mutex> lock(room_mutex_);
      room_.notify_one();
    }
  }

 private:
  static constexpr uint64_t kNone = ~uint64_t(0);

  // Receives the next bytes straight into the posted destination when they belong there. Returns
  // false when there is no such post (the caller then receives into the inbox). The receive itself
  // is non-blocking and made under direct_mutex_, so cancel_recv() never waits on the network.
  bool receive_posted() {
    if (!direct_posted_.load(std::memory_order_acquire)) return false;
    uint64_t written = written_.load(std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> lock(direct_mutex_);
      if (direct_dst_ == nullptr || written < direct_begin_ || written >= direct_end_) return false;
    }
    pollfd p{recv_fd_, POLLIN, 0};
    ::poll(&p, 1, 10);  // bounded, so a cancel or a stop is seen soon
    std::lock_guard<std::mutex> lock(direct_mutex_);
    if (direct_dst_ == nullptr || written < direct_begin_ || written >= direct_end_) return true;  // look again
    ssize_t k = ::recv(recv_fd_, direct_dst_ + (written - direct_begin_),
                       size_t(std::min<uint64_t>(direct_end_ - written, tuning::kTcpInboxChunk)), MSG_DONTWAIT);
    if (k > 0) {
      if (direct_from_.load(std::memory_order_relaxed) == kNone) direct_from_.store(written, std::memory_order_relaxed);
      written_.store(written + uint64_t(k), std::memory_order_release);
      owner().wake();
      return true;
    }
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return true;
    return false;  // end of stream or an error: the inbox's recv() below meets it too and reports it
  }

  void receive_loop() {
    for (;;) {
      if (stopping_.load()) return;
      if (receive_posted()) continue;
      uint64_t written = written_.load(std::memory_order_relaxed);
      // Bytes put straight into a posted destination count until the consumer has taken them, and
      // may outnumber the inbox's size for a while.
      uint64_t unread = written - read_published_.load(std::memory_order_acquire);
      size_t free = unread >= inbox_.size() ? 0 : inbox_.size() - size_t(unread);
      if (free == 0) {  // the inbox is full: wait for the consumer to release some
        std::unique_lock<std::mutex> lock(room_mutex_);
        receiver_waiting_.store(true, std::memory_order_seq_cst);
        room_.wait(lock, [&] {
          return stopping_.load() || written - read_published_.load(std::memory_order_acquire) < inbox_.size();
        });
        receiver_waiting_.store(false);
        if (stopping_.load()) return;
        continue;
      }
      size_t at = written % inbox_.size();
      size_t want = std::min({free, inbox_.size() - at, tuning::kTcpInboxChunk});
      // Up to a post's first byte, so that what belongs there goes there (a post made ahead).
      if (direct_posted_.load(std::memory_order_acquire)) {
        std::lock_guard<std::mutex> lock(direct_mutex_);
        if (direct_dst_ != nullptr && written < direct_begin_)
          want = size_t(std::min<uint64_t>(want, direct_begin_ - written));
      }
      ssize_t k = ::recv(recv_fd_, inbox_.data() + at, want, 0);
      if (k > 0) {
        written_.store(written + uint64_t(k), std::memory_order_release);
        owner().wake();
        continue;
      }
      if (k < 0 && errno == EINTR) continue;
      if (stopping_.load()) return;
      close_reason_ = k == 0 ? "the peer closed the connection (its process exited or aborted)"
                             : "receiving failed: " + errno_text(errno);
      owner().record_hangup(peer());
      closed_.store(true, std::memory_order_release);
      owner().wake();
      return;
    }
  }

  TcpTransport& owner() const { return static_cast<TcpTransport&>(transport()); }
  int send_fd_, recv_fd_;
  // Allocated but never cleared: a page becomes resident only once bytes arrive there, so a peer
  // that sends little costs little memory (a rank has one inbox per peer).
  std::unique_ptr<std::byte[]> inbox_memory_;
  std::span<std::byte> inbox_;
  std::atomic<uint64_t> written_{0};         // bytes the receiver has put in the inbox
  uint64_t read_ = 0;                        // bytes the consumer has released (its own copy)
  std::atomic<uint64_t> read_published_{0};  // read_, for the receiver
  std::atomic<bool> closed_{false}, stopping_{false}, receiver_waiting_{false};
  std::string close_reason_;  // written before closed_ is set
  // The posted receive (post_recv): stream bytes [direct_begin_, direct_end_) belong at direct_dst_.
  std::mutex direct_mutex_;
  std::byte* direct_dst_ = nullptr;  // under direct_mutex_ (read by the consumer, its writer)
  uint64_t direct_begin_ = 0, direct_end_ = 0;
  std::atomic<bool> direct_posted_{false};
  std::atomic<uint64_t> direct_from_{kNone};  // the first byte the receiver put at direct_dst_
  std::mutex room_mutex_;
  std::condition_variable room_;
  std::thread receiver_;
};

TcpTransport::TcpTransport(Store& store, const std::string& prefix, int rank, const std::vector<int>& peers,
                           const std::vector<std::string>& host_ids, const std::vector<int>& pids,
                           std::chrono::milliseconds timeout, TcpTransportOptions options)
    : rank_(rank),
      local_pids_(host_ids.size(), 0),
      connections_(host_ids.size()),
      wakeup_fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  TINYDDP_CHECK(wakeup_fd_ >= 0, "tcp transport: eventfd failed: ", errno_text(errno),
                hint("check the open-file limit"));
  bool any_remote = false;
  for (int p : peers) {
    any_remote |= host_ids[p] != host_ids[rank];
    if (host_ids[p] == host_ids[rank] && p < int(pids.size())) local_pids_[p] = pids[p];
  }
  MeshSpec spec;
  spec.rank = rank;
  spec.world_size = int(host_ids.size());
  spec.peers = peers;
  spec.prefix = prefix;
  spec.token = options.token;
  // Peers all on this host: loopback only. Some on another host: the one interface that faces them.
  spec.listen_on = any_remote ? peer_facing_address(options.advertise_address, options.route_to) : "127.0.0.1";
  spec.bind_all = any_remote && (options.bind_all || bind_all_from_environment());
  spec.socket_buffer_bytes = options.socket_buffer_bytes;
  spec.timeout = timeout;
  std::vector<SocketPair> sockets = connect_mesh(store, spec);
  for (int p : peers)
    connections_[p] = std::make_unique<TcpConnection>(*this, p, sockets[p].send_fd, sockets[p].recv_fd);
}

TcpTransport::~TcpTransport() {
  connections_.clear();  // joins the receivers first: they write to wakeup_fd_
  if (wakeup_fd_ >= 0) ::close(wakeup_fd_);
}

Connection* TcpTransport::connection(int peer) {
  return peer >= 0 && peer < int(connections_.size()) ? connections_[peer].get() : nullptr;
}

void TcpTransport::sleep_once(std::span<const WaitFor> waits, std::chrono::microseconds max_sleep) {
  // Incoming bytes are announced by the receivers on the eventfd; room to send by poll().
  std::vector<pollfd> fds{{wakeup_fd_, POLLIN, 0}};
  bool ready = false;
  waiting_.store(true, std::memory_order_seq_cst);
  for (const WaitFor& w : waits) {
    auto* peer = static_cast<TcpConnection*>(w.connection);
    if (w.recv && peer->available()) ready = true;
    if (w.send) fds.push_back({peer->send_fd(), POLLOUT, 0});
  }
  if (!ready) {
    timespec ts{time_t(max_sleep.count() / 1000000), long(max_sleep.count() % 1000000) * 1000};
    ::ppoll(fds.data(), fds.size(), &ts, nullptr);
  }
  waiting_.store(false, std::memory_order_seq_cst);
  uint64_t drained;
  while (::read(wakeup_fd_, &drained, sizeof drained) > 0) {}
}

void TcpTransport::wake() {
  if (waiting_.load(std::memory_order_seq_cst)) {
    uint64_t one = 1;
    ssize_t ignored = ::write(wakeup_fd_, &one, sizeof one);
    (void)ignored;
  }
}

void TcpTransport::record_hangup(int peer) {
  std::lock_guard<std::mutex> lock(hangups_mutex_);
  for (const HangUp& h : hangups_)
    if (h.rank == peer) return;
  hangups_.push_back({peer, Clock::now()});
}

void TcpTransport::record_hangups(std::chrono::microseconds max_wait) {
  // The receivers record hang-ups as they happen; give those already on their way a moment.
  std::this_thread::sleep_for(max_wait);
}

std::string TcpTransport::hangup_summary() const {
  std::string text;
  auto now = Clock::now();
  for (const HangUp& h : hangups_) {
    auto ago = std::chrono::duration_cast<std::chrono::milliseconds>(now - h.when).count();
    text += (text.empty() ? "" : ", ") + std::string("rank ") + std::to_string(h.rank) + " (" + std::to_string(ago) +
            " ms ago)";
  }
  return text;
}

std::string TcpTransport::dead_local_peers(bool skip_unread, const std::function<bool(int)>& among) const {
  std::string dead;
  for (size_t r = 0; r < local_pids_.size(); ++r) {
    if (local_pids_[r] <= 0 || (among && !among(int(r))) || process_alive(local_pids_[r])) continue;
    // Gone, but what it sent before it went is still in our inbox: not a failure while it lasts
    // (the pid is looked at first, so bytes that arrive in between are seen).
    if (skip_unread && connections_[r] && connections_[r]->has_unread()) continue;
    dead += (dead.empty() ? "" : ", ") + std::to_string(r);
  }
  return dead;
}

void TcpTransport::check_peers(std::chrono::milliseconds stalled_for, std::span<const int> awaited) {
  if (stalled_for < kHangupGrace) return;
  // An awaited peer process that is gone and a rank that made no progress since: it died
  // mid-collective (a clean exit after its last collective leaves nothing waiting on it). A peer
  // that sent its last bytes and exited at once is no failure until those bytes are read: its
  // receiver thread drains the socket before it reports the hang-up, and peers with unread bytes
  // are skipped. Peers not awaited may have ended cleanly (see Transport::check_peers).
  auto is_awaited = [&](int r) { return std::find(awaited.begin(), awaited.end(), r) != awaited.end(); };
  std::string dead = dead_local_peers(/*skip_unread=*/true, is_awaited);
  if (!dead.empty())
    TINYDDP_FAIL("tcp transport: rank(s) ", dead, " died (the process is gone) while rank ", rank_,
                 " waited in a collective with them",
                 hint("look at rank ", dead.substr(0, dead.find(',')),
                      "'s output and exit status (killed by a signal? out of memory?)"));
  std::lock_guard<std::mutex> lock(hangups_mutex_);
  const HangUp* first = nullptr;
  for (const HangUp& h : hangups_)
    if (is_awaited(h.rank) && (!connections_[h.rank] || !connections_[h.rank]->has_unread())) {
      first = &h;
      break;
    }
  if (!first || Clock::now() - first->when < kHangupGrace) return;
  TINYDDP_FAIL("tcp transport: rank ", first->rank, " closed its connections (its process died or aborted) and rank ",
               rank_, " has made no progress since; ranks that hung up, first first: ", hangup_summary(),
               hint("look at rank ", first->rank, "'s own output for the first error"));
}

void TcpTransport::fail_connection(int peer, const std::string& what) {
  // The broken connection may lead to a neighbour that merely aborted after someone else failed:
  // name the peers on this host that are gone, and every peer whose connection is closed by now
  // (a moment's wait lets the hang-ups already on their way arrive).
  std::string dead = dead_local_peers(/*skip_unread=*/false);
  record_hangups(std::chrono::microseconds(100'000));
  std::string closed;
  {
    std::lock_guard<std::mutex> lock(hangups_mutex_);
    for (const HangUp& h : hangups_) closed += (closed.empty() ? "" : ", ") + std::to_string(h.rank);
  }
  std::string first = !dead.empty() ? dead.substr(0, dead.find(',')) : std::to_string(peer);
  TINYDDP_FAIL("tcp transport: connection from rank ", rank_, " to rank ", peer, " broke: ", what,
               dead.empty() ? std::string() : "; rank(s) " + dead + " died (the process is gone)",
               closed.empty() ? std::string() : "; rank(s) " + closed + " closed their connections",
               hint("look at rank ", first, "'s own output and exit status for the first error"));
}

void TcpTransport::abort(const std::string& /*reason*/) {
  // Shutting the sockets down (not closing: the descriptors stay valid for this rank's threads)
  // sends every peer an EOF now, instead of after its timeout.
  for (auto& peer : connections_) {
    if (!peer) continue;
    peer->stop_receiving();
    ::shutdown(peer->send_fd(), SHUT_RDWR);
    ::shutdown(peer->recv_fd(), SHUT_RDWR);
  }
}

}  // namespace tinyddp::comm
