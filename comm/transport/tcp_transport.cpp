#include "comm/transport/tcp_transport.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>
#include <thread>
#include <utility>

#include "core/error.h"
#include "core/log.h"

namespace tinyddp::comm {

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kMagic = 0x50444454;  // "TDDP"
constexpr uint16_t kVersion = 2;
constexpr uint8_t kHello = 0, kAccepted = 1;
// Two sockets per pair of ranks, one per direction (as NCCL's socket transport does): with data
// flowing both ways on one socket, each direction's ACKs and window updates queue behind the other
// direction's segments and on loopback a one-thread duplex transfer stalls now and then; with one
// socket per direction it moved 10-20% more on the 2-core reference host.
constexpr uint8_t kUpward = 0, kDownward = 1;
// How long a rank may make no progress after some peer hung up before it calls that a failure
// (a peer that exited cleanly after its last collective also hangs up, and must not be blamed).
constexpr auto kHangupGrace = std::chrono::milliseconds(1000);

// The first bytes of every connection. Both ends are the same build on little-endian hosts.
struct Handshake {
  uint32_t magic;
  uint16_t version;
  uint8_t kind;     // kHello or kAccepted
  uint8_t channel;  // kUpward: the connecting (higher) rank sends on it; kDownward: it receives
  int32_t from;
  int32_t to;
  uint64_t group;  // digest of the group's store prefix: a connection for another group is refused
  uint64_t token;  // digest of the job token: never the token itself on the wire
};
static_assert(sizeof(Handshake) == 32);

// How long a connection on the listener may take to send its whole handshake before it is refused.
constexpr auto kHandshakeGrace = std::chrono::seconds(5);
// At most this many accepted connections wait for their handshakes at once; more wait in the
// listener's backlog (a flood of silent sockets must not use up this rank's file descriptors).
constexpr size_t kMaxKnocks = 64;

// A connection accepted on the listener whose handshake has not arrived whole yet. Each has its own
// grace, and all are heard at once with poll(), so one that stays silent holds up nobody else.
struct Knock {
  enum class Heard { more, all, hung_up };

  int fd = -1;
  std::string source;  // "address:port", for the log
  Clock::time_point accepted, grace_ends;
  Handshake hello{};
  size_t got = 0;  // bytes of `hello` that arrived

  // The next connection waiting on the (non-blocking) listener, or nothing when there is none now.
  static std::optional<Knock> accept(int listener, Clock::time_point grace_ends) {
    for (;;) {
      sockaddr_in from{};
      socklen_t from_len = sizeof from;
      int fd = ::accept4(listener, reinterpret_cast<sockaddr*>(&from), &from_len, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0 && errno == EINTR) continue;
      // EAGAIN: nobody else waits; anything else (the peer reset before accept, out of descriptors)
      // is that one connection's problem, and poll() wakes this rank again for the next one.
      if (fd < 0) return std::nullopt;
      char who[INET_ADDRSTRLEN] = "?";
      ::inet_ntop(AF_INET, &from.sin_addr, who, sizeof who);
      Knock knock;
      knock.fd = fd;
      knock.source = std::string(who) + ":" + std::to_string(ntohs(from.sin_port));
      knock.accepted = Clock::now();
      knock.grace_ends = grace_ends;
      return knock;
    }
  }

  // Reads what has arrived of the handshake, without blocking.
  Heard hear() {
    while (got < sizeof hello) {
      ssize_t k = ::recv(fd, reinterpret_cast<char*>(&hello) + got, sizeof hello - got, MSG_DONTWAIT);
      if (k > 0) {
        got += size_t(k);
      } else if (k < 0 && errno == EINTR) {
        continue;
      } else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        return Heard::more;
      } else {
        return Heard::hung_up;  // EOF or a reset
      }
    }
    return Heard::all;
  }

  // "7 of 32 bytes in 1200 ms", for the log.
  std::string progress() const {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - accepted).count();
    return std::to_string(got) + " of " + std::to_string(sizeof hello) + " bytes in " + std::to_string(ms) + " ms";
  }
};

uint64_t fnv1a(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::string errno_text(int err) { return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")"; }

int remaining_ms(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return int(std::clamp<long long>(left, 0, 1 << 30));
}

// Blocking-with-deadline helpers for the handshake (the data path is non-blocking).
bool wait_fd(int fd, short events, Clock::time_point deadline) {
  pollfd p{fd, events, 0};
  for (;;) {
    int rc = ::poll(&p, 1, remaining_ms(deadline));
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) return false;
  }
}

bool write_all(int fd, const void* data, size_t n, Clock::time_point deadline) {
  auto* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k > 0) {
      p += k;
      n -= size_t(k);
    } else if (k < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (!wait_fd(fd, POLLOUT, deadline)) return false;
    } else {
      return false;
    }
  }
  return true;
}

bool read_all(int fd, void* data, size_t n, Clock::time_point deadline) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t k = ::recv(fd, p, n, MSG_DONTWAIT);
    if (k > 0) {
      p += k;
      n -= size_t(k);
    } else if (k < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (!wait_fd(fd, POLLIN, deadline)) return false;
    } else {
      return false;
    }
  }
  return true;
}

// Whether a process on this host still runs (a killed child stays a zombie until reaped, and
// kill() still finds zombies, hence the look at /proc).
bool process_alive(int pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;
  auto close_paren = line.rfind(')');
  char state = close_paren != std::string::npos && close_paren + 2 < line.size() ? line[close_paren + 2] : 'R';
  return state != 'Z' && state != 'X';
}

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

void tune_socket(int fd, size_t buffer_bytes) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (buffer_bytes > 0) {
    int bytes = int(std::min<size_t>(buffer_bytes, 1u << 30));
    // The FORCE variants pass net.core.[rw]mem_max when the process may (root); else the capped one.
    if (::setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &bytes, sizeof bytes) != 0)
      ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
    if (::setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &bytes, sizeof bytes) != 0)
      ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes);
  }
}

bool is_loopback(const std::string& address) { return address.rfind("127.", 0) == 0; }

// The IPv4 address of network interface `name` ("" when it has none).
std::string interface_address(const std::string& name) {
  ifaddrs* all = nullptr;
  if (::getifaddrs(&all) != 0) return "";
  std::string address;
  for (ifaddrs* i = all; i && address.empty(); i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || name != i->ifa_name) continue;
    char text[INET_ADDRSTRLEN] = {};
    if (::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, text, sizeof text)) address = text;
  }
  ::freeifaddrs(all);
  return address;
}

// The first IPv4 address of an interface that is up and not loopback ("" when there is none).
std::string first_interface_address() {
  ifaddrs* all = nullptr;
  if (::getifaddrs(&all) != 0) return "";
  std::string address;
  for (ifaddrs* i = all; i && address.empty(); i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK)) continue;
    char text[INET_ADDRSTRLEN] = {};
    if (::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, text, sizeof text)) address = text;
  }
  ::freeifaddrs(all);
  return address;
}

// The local address this host uses to reach `host`: the kernel's route lookup, through a UDP
// socket's connect(), which sends nothing. "" when `host` does not resolve or is unreachable.
std::string route_source(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), "9", &hints, &found) != 0 || !found) return "";
  std::string address;
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in local{};
  socklen_t len = sizeof local;
  char text[INET_ADDRSTRLEN] = {};
  if (fd >= 0 && ::connect(fd, found->ai_addr, found->ai_addrlen) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 && ::inet_ntop(AF_INET, &local.sin_addr, text, sizeof text))
    address = text;
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(found);
  return address;
}

// The first IPv4 address, not loopback, that this host's name resolves to ("" when none).
std::string hostname_address() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "";
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(name, nullptr, &hints, &found) != 0) return "";
  std::string address;
  for (addrinfo* a = found; a && address.empty(); a = a->ai_next) {
    char text[INET_ADDRSTRLEN] = {};
    auto* in = reinterpret_cast<sockaddr_in*>(a->ai_addr);
    if (::inet_ntop(AF_INET, &in->sin_addr, text, sizeof text) && !is_loopback(text)) address = text;
  }
  ::freeaddrinfo(found);
  return address;
}

// The address of the interface this rank talks to other hosts through: it listens there (and
// only there) and publishes it. In order: what the caller or TINYDDP_SOCKET_ADDR names, the
// interface TINYDDP_IFNAME names, the interface the route to the store's host leaves through
// (the one the store connection itself uses), the address of this host's name, the first
// interface that is up, and loopback when there is nothing else.
std::string peer_facing_address(const TcpTransportOptions& options) {
  if (!options.advertise_address.empty()) return options.advertise_address;
  if (const char* env = std::getenv("TINYDDP_SOCKET_ADDR"); env && *env) return env;
  if (const char* ifname = std::getenv("TINYDDP_IFNAME"); ifname && *ifname) {
    std::string address = interface_address(ifname);
    TINYDDP_CHECK(!address.empty(), "tcp transport: TINYDDP_IFNAME='", ifname,
                  "' names no network interface with an IPv4 address; hint: pick one that `ip -4 addr` lists, or unset it");
    return address;
  }
  if (!options.route_to.empty())
    if (std::string address = route_source(options.route_to); !address.empty() && !is_loopback(address)) return address;
  if (std::string address = hostname_address(); !address.empty()) return address;
  if (std::string address = first_interface_address(); !address.empty()) return address;
  return "127.0.0.1";
}

bool bind_all_from_environment() {
  const char* env = std::getenv("TINYDDP_BIND_ALL");
  return env && (std::string(env) == "1" || std::string(env) == "true" || std::string(env) == "yes");
}

}  // namespace

// ---- one peer: a socket to send on, and a socket a receiver thread drains into a ring ----
//
// Why a thread: one thread that alternates non-blocking send() and recv() leaves the incoming
// socket undrained while it sends (and the reverse), and loopback TCP then keeps stalling on full
// windows; a blocking recv() on a thread of its own keeps the window open. Measured on the 2-core
// host with a plain duplex transfer: 1.2-2.4 GB/s each way with the thread, 0.6-0.8 without.
// The communication thread then reads the ring like the shared-memory transport's (peek, reduce
// in place, release), and sleeps on an eventfd the receiver rings when bytes arrive.
class TcpTransport::Peer : public Connection {
 public:
  Peer(TcpTransport& transport, int peer, int send_fd, int recv_fd)
      : Connection(transport, peer), send_fd_(send_fd), recv_fd_(recv_fd), ring_(kRingBytes) {
    // The receiver blocks in recv(): its socket must be blocking (the send socket is not).
    ::fcntl(recv_fd_, F_SETFL, ::fcntl(recv_fd_, F_GETFL) & ~O_NONBLOCK);
    receiver_ = std::thread([this] { receive_loop(); });
  }
  ~Peer() override {
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
      // Ring bytes only, and only those known to be ring bytes by this snapshot: once the receiver
      // starts putting bytes in place, written_ moves on past slots of the ring it never wrote.
      uint64_t ring_end = from != kNone && from > read_ ? std::min(from, written) : written;
      size_t want = size_t(std::min<uint64_t>(n - got, ring_end - std::min(ring_end, read_)));
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
    if (n < kPostBytes) return;  // a copy of a few hundred KiB costs less than the bookkeeping
    std::lock_guard<std::mutex> lock(direct_mutex_);
    direct_dst_ = dst;
    direct_begin_ = read_ + skip;
    direct_end_ = direct_begin_ + n;
    direct_posted_.store(true, std::memory_order_release);
  }

  // A receiver thread drains the socket whatever the communication thread does, so that thread
  // need not come back to receiving often, and each turn costs a send() and a pass through the
  // engine's loop. 1 MiB turns instead of 128 KiB, in-place busbw medians of 4 alternating runs:
  // 2 ranks 4/16/64 MiB 2.14/2.22/2.07 -> 3.40/2.63/2.54 GB/s (512 KiB and 2 MiB did no better);
  // 4 ranks on 2 cores 0.69/0.88/0.92 -> 0.91/1.13/1.06.
  size_t segment_bytes() const override { return size_t(1) << 20; }

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
    // Only ring bytes: from the first byte put in a posted destination on, the ring's slots were
    // never written (the consumer reads those with try_recv, which counts them).
    uint64_t from = direct_from_.load(std::memory_order_relaxed);
    if (from != kNone && from > read_) written = std::min(written, from);
    size_t at = read_ % ring_.size();
    size_t n = std::min({size_t(written - read_), ring_.size() - at, max});
    return {ring_.data() + at, n};
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
  static constexpr size_t kRingBytes = 4 << 20;
  // Posted receives shorter than this are left to the ring.
  static constexpr size_t kPostBytes = 1 << 20;
  // At most this much per recv() into the ring, so a receive posted meanwhile takes over soon.
  static constexpr size_t kRingChunk = 256 << 10;
  static constexpr uint64_t kNone = ~uint64_t(0);

  // Receives the next bytes straight into the posted destination when they belong there. Returns
  // false when there is no such post (the caller then receives into the ring). The receive itself
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
    ssize_t k = ::recv(recv_fd_, direct_dst_ + (written - direct_begin_), size_t(std::min<uint64_t>(direct_end_ - written, kRingChunk)),
                       MSG_DONTWAIT);
    if (k > 0) {
      if (direct_from_.load(std::memory_order_relaxed) == kNone) direct_from_.store(written, std::memory_order_relaxed);
      written_.store(written + uint64_t(k), std::memory_order_release);
      owner().ring_doorbell();
      return true;
    }
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return true;
    return false;  // end of stream or an error: the ring's recv() below meets it too and reports it
  }

  void receive_loop() {
    for (;;) {
      if (stopping_.load()) return;
      if (receive_posted()) continue;
      uint64_t written = written_.load(std::memory_order_relaxed);
      // Bytes put straight into a posted destination count until the consumer has taken them, and
      // may outnumber the ring's size for a while.
      uint64_t unread = written - read_published_.load(std::memory_order_acquire);
      size_t free = unread >= ring_.size() ? 0 : ring_.size() - size_t(unread);
      if (free == 0) {  // the ring is full: wait for the consumer to release some
        std::unique_lock<std::mutex> lock(room_mutex_);
        receiver_waiting_.store(true, std::memory_order_seq_cst);
        room_.wait(lock, [&] {
          return stopping_.load() || written - read_published_.load(std::memory_order_acquire) < ring_.size();
        });
        receiver_waiting_.store(false);
        if (stopping_.load()) return;
        continue;
      }
      size_t at = written % ring_.size();
      size_t want = std::min({free, ring_.size() - at, kRingChunk});
      // Up to a post's first byte, so that what belongs there goes there (a post made ahead).
      if (direct_posted_.load(std::memory_order_acquire)) {
        std::lock_guard<std::mutex> lock(direct_mutex_);
        if (direct_dst_ != nullptr && written < direct_begin_) want = size_t(std::min<uint64_t>(want, direct_begin_ - written));
      }
      ssize_t k = ::recv(recv_fd_, ring_.data() + at, want, 0);
      if (k > 0) {
        written_.store(written + uint64_t(k), std::memory_order_release);
        owner().ring_doorbell();
        continue;
      }
      if (k < 0 && errno == EINTR) continue;
      if (stopping_.load()) return;
      close_reason_ = k == 0 ? "the peer closed the connection (its process exited or aborted)"
                             : "receiving failed: " + errno_text(errno);
      owner().record_hangup(peer());
      closed_.store(true, std::memory_order_release);
      owner().ring_doorbell();
      return;
    }
  }

  TcpTransport& owner() const { return static_cast<TcpTransport&>(transport()); }
  int send_fd_, recv_fd_;
  std::vector<std::byte> ring_;
  std::atomic<uint64_t> written_{0};         // bytes the receiver has put in the ring
  uint64_t read_ = 0;                        // bytes the consumer has released (its own copy)
  std::atomic<uint64_t> read_published_{0};  // read_, for the receiver
  std::atomic<bool> closed_{false}, stopping_{false}, receiver_waiting_{false};
  std::string close_reason_;                 // written before closed_ is set
  // The posted receive (post_recv): stream bytes [direct_begin_, direct_end_) belong at direct_dst_.
  std::mutex direct_mutex_;
  std::byte* direct_dst_ = nullptr;          // under direct_mutex_ (read by the consumer, its writer)
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
    : rank_(rank), local_pids_(host_ids.size(), 0), peers_(host_ids.size()),
      wakeup_fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  TINYDDP_CHECK(wakeup_fd_ >= 0, "tcp transport: eventfd failed: ", errno_text(errno), "; hint: check the open-file limit");
  for (int p : peers)
    if (host_ids[p] == host_ids[rank] && p < int(pids.size())) local_pids_[p] = pids[p];
  const auto deadline = Clock::now() + timeout;
  const uint64_t group = fnv1a(prefix);
  const uint64_t token = fnv1a(options.token);
  bool any_remote = false;
  for (int p : peers) any_remote |= host_ids[p] != host_ids[rank];

  // 1. Listen and publish where. Peers all on this host: on loopback only. Some on another host:
  // on the one interface that faces them (see peer_facing_address), never on every address of
  // the host unless asked (TINYDDP_BIND_ALL=1): the port takes data from anyone who reaches it.
  const std::string interface = any_remote ? peer_facing_address(options) : "127.0.0.1";
  const bool bind_all = any_remote && (options.bind_all || bind_all_from_environment());
  int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);  // non-blocking: see Knock::accept
  TINYDDP_CHECK(listener >= 0, "tcp transport: socket() failed: ", errno_text(errno), "; hint: check the open-file limit (ulimit -n)");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  if (bind_all) {
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
  } else if (::inet_pton(AF_INET, interface.c_str(), &addr.sin_addr) != 1) {
    ::close(listener);
    TINYDDP_FAIL("tcp transport: rank ", rank, " would listen on '", interface,
                 "', which is not an IPv4 address; hint: set TINYDDP_SOCKET_ADDR to this host's IPv4 address (or TINYDDP_IFNAME to its interface)");
  }
  socklen_t len = sizeof addr;
  if (::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(listener, 128) != 0 ||
      ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    int err = errno;
    ::close(listener);
    TINYDDP_FAIL("tcp transport: rank ", rank, " could not listen on ", bind_all ? std::string("every address") : interface, ": ",
                 errno_text(err), "; hint: the address must belong to this host (TINYDDP_SOCKET_ADDR / TINYDDP_IFNAME pick it)");
  }
  const std::string advertised = interface + ":" + std::to_string(ntohs(addr.sin_port));
  store.set(prefix + "tcp/" + std::to_string(rank), advertised);

  // The two sockets of each pair, [peer][channel], until both are there.
  std::vector<std::array<int, 2>> pending(host_ids.size(), {-1, -1});
  auto finish = [&](int peer, int channel, int fd, bool connector) {
    tune_socket(fd, options.socket_buffer_bytes);
    set_nonblocking(fd);
    pending[peer][channel] = fd;
    if (pending[peer][kUpward] < 0 || pending[peer][kDownward] < 0) return;
    // The higher rank connected: it sends upward and receives downward; the lower the reverse.
    int send_fd = connector ? pending[peer][kUpward] : pending[peer][kDownward];
    int recv_fd = connector ? pending[peer][kDownward] : pending[peer][kUpward];
    peers_[peer] = std::make_unique<Peer>(*this, peer, send_fd, recv_fd);
  };
  auto close_pending = [&] {
    for (size_t p = 0; p < pending.size(); ++p)
      if (!peers_[p])
        for (int fd : pending[p])
          if (fd >= 0) ::close(fd);
  };

  try {
    // 2. Connect to every lower rank and wait for its acceptance. Lower ranks accept only after
    // their own connects finished, so rank 0 answers first and the chain cannot deadlock.
    for (int p : peers) {
      if (p > rank) continue;
      std::string where = store.get(prefix + "tcp/" + std::to_string(p));
      // The address the peer listens on, even on this host: a peer with ranks on other hosts listens
      // only on the interface facing them (a connection to it from here still stays inside the host).
      std::string host = where.substr(0, where.rfind(':'));
      int port = std::stoi(where.substr(where.rfind(':') + 1));
      sockaddr_in to{};
      to.sin_family = AF_INET;
      to.sin_port = htons(uint16_t(port));
      TINYDDP_CHECK(::inet_pton(AF_INET, host.c_str(), &to.sin_addr) == 1, "tcp transport: rank ", p,
                    " published the address '", where, "', which is not IPv4 host:port; hint: set TINYDDP_SOCKET_ADDR to this host's IPv4 address");
      for (uint8_t channel : {kUpward, kDownward}) {
      int fd = -1;
      for (int attempt = 0;; ++attempt) {
        fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) == 0) break;
        int err = errno;
        ::close(fd);
        fd = -1;
        TINYDDP_CHECK(Clock::now() < deadline, "tcp transport: rank ", rank, " could not connect to rank ", p, " at ",
                      host, ":", port, ": ", errno_text(err),
                      "; hint: check that the hosts reach each other on that address (TINYDDP_SOCKET_ADDR picks it) and that no firewall blocks it");
        std::this_thread::sleep_for(std::chrono::milliseconds(std::min(100, 1 << std::min(attempt, 6))));
      }
      Handshake hello{kMagic, kVersion, kHello, channel, rank, p, group, token};
      Handshake reply{};
      bool ok = write_all(fd, &hello, sizeof hello, deadline) && read_all(fd, &reply, sizeof reply, deadline);
      if (!ok || reply.magic != kMagic || reply.kind != kAccepted || reply.from != p || reply.channel != channel) {
        ::close(fd);
        TINYDDP_FAIL("tcp transport: rank ", p, " at ", host, ":", port, " refused or did not answer rank ", rank,
                     "'s handshake; hint: every rank needs the same TINYDDP_TOKEN and the same tinyddp version, and the "
                     "address must belong to this job (its log says why it refused)");
      }
      finish(p, channel, fd, /*connector=*/true);
      }
    }

    // 3. Accept every higher rank (two sockets each). Anything else that knocks is refused with a
    // logged reason. Handshakes are heard concurrently (see Knock), so a stranger that connects and
    // stays silent costs the real ranks nothing: they are let in as soon as their 32 bytes arrive.
    int expected = 2 * int(std::count_if(peers.begin(), peers.end(), [&](int p) { return p > rank; }));
    auto refuse = [&](Knock& knock, const std::string& reason) {
      log_line(LogLevel::warn, "tcp-transport",
               "rank " + std::to_string(rank) + " refused a connection from " + knock.source + ": " + reason);
      ::close(knock.fd);
      knock.fd = -1;
    };
    // Why a complete handshake is refused ("" when it is one of this rank's expected connections).
    auto refusal_for = [&](const Handshake& hello) -> std::string {
      if (hello.magic != kMagic) return "not a tinyddp transport handshake (wrong magic)";
      if (hello.version != kVersion)
        return "protocol version " + std::to_string(hello.version) + ", this rank speaks " + std::to_string(kVersion);
      if (hello.token != token) return "wrong job token (TINYDDP_TOKEN differs)";
      if (hello.group != group) return "it belongs to another process group or job";
      if (hello.to != rank) return "it wanted rank " + std::to_string(hello.to);
      if (hello.from <= rank || hello.from >= int(peers_.size()) ||
          std::find(peers.begin(), peers.end(), int(hello.from)) == peers.end())
        return "rank " + std::to_string(hello.from) + " is not a peer that connects to this rank";
      if (hello.channel > kDownward) return "unknown channel " + std::to_string(hello.channel);
      if (peers_[hello.from] || pending[hello.from][hello.channel] >= 0)
        return "rank " + std::to_string(hello.from) + " is connected already";
      return "";
    };
    // A whole handshake arrived: let the rank in (answer it) or refuse it.
    auto judge = [&](Knock& knock) {
      if (std::string reason = refusal_for(knock.hello); !reason.empty()) return refuse(knock, reason);
      Handshake reply{kMagic, kVersion, kAccepted, knock.hello.channel, rank, knock.hello.from, group, token};
      int fd = std::exchange(knock.fd, -1);
      if (!write_all(fd, &reply, sizeof reply, deadline)) {
        ::close(fd);
        return;
      }
      finish(knock.hello.from, knock.hello.channel, fd, /*connector=*/false);
      --expected;
    };

    std::vector<Knock> knocks;
    try {
      while (expected > 0) {
        const auto now = Clock::now();
        for (Knock& knock : knocks)
          if (now >= knock.grace_ends) refuse(knock, "no handshake within 5 s (" + knock.progress() + ")");
        std::erase_if(knocks, [](const Knock& k) { return k.fd < 0; });
        if (now >= deadline) {
          std::string missing;
          for (int p : peers)
            if (p > rank && !peers_[p]) missing += (missing.empty() ? "" : ", ") + std::to_string(p);
          TINYDDP_FAIL("tcp transport: rank ", rank, " timed out after ", timeout.count(), " ms waiting for rank(s) ", missing,
                       " to connect; hint: those ranks did not start, failed earlier, or cannot reach ", advertised);
        }

        // Sleep until the listener or a knock has something, or the next grace or the deadline ends.
        // At kMaxKnocks unheard sockets the listener is left out: newcomers wait in its backlog.
        auto wake = deadline;
        std::vector<pollfd> fds{{knocks.size() < kMaxKnocks ? listener : -1, POLLIN, 0}};
        for (const Knock& knock : knocks) {
          fds.push_back({knock.fd, POLLIN, 0});
          wake = std::min(wake, knock.grace_ends);
        }
        if (::poll(fds.data(), fds.size(), remaining_ms(wake) + 1) <= 0) continue;  // timeouts, EINTR: looked at above

        for (size_t i = 0; i < knocks.size(); ++i) {
          if (fds[i + 1].revents == 0) continue;
          Knock& knock = knocks[i];
          switch (knock.hear()) {
            case Knock::Heard::more: break;
            case Knock::Heard::hung_up: refuse(knock, "no handshake within 5 s (it hung up after " + knock.progress() + ")"); break;
            case Knock::Heard::all: judge(knock); break;
          }
        }
        if (fds[0].revents != 0)
          while (knocks.size() < kMaxKnocks) {
            std::optional<Knock> knock = Knock::accept(listener, std::min(deadline, Clock::now() + kHandshakeGrace));
            if (!knock) break;
            knocks.push_back(std::move(*knock));
          }
      }
    } catch (...) {
      for (Knock& knock : knocks)
        if (knock.fd >= 0) ::close(knock.fd);
      throw;
    }
    // Every rank is in: whoever is still mid-handshake cannot be one of them (a second connection
    // for a rank would be refused as "connected already"), and the group does not wait for it.
    for (Knock& knock : knocks)
      if (knock.fd >= 0)
        refuse(knock, "no handshake yet when every rank had joined (" + knock.progress() +
                          "); the group does not wait out a stranger's 5 s grace");
  } catch (...) {
    ::close(listener);
    close_pending();
    throw;
  }
  ::close(listener);
}

TcpTransport::~TcpTransport() {
  peers_.clear();  // joins the receivers first: they ring wakeup_fd_
  if (wakeup_fd_ >= 0) ::close(wakeup_fd_);
}

Connection* TcpTransport::connection(int peer) {
  return peer >= 0 && peer < int(peers_.size()) ? peers_[peer].get() : nullptr;
}

void TcpTransport::sleep_once(std::span<const WaitFor> waits, std::chrono::microseconds max_sleep) {
  // Incoming bytes are announced by the receivers on the eventfd; room to send by poll().
  std::vector<pollfd> fds{{wakeup_fd_, POLLIN, 0}};
  bool ready = false;
  waiting_.store(true, std::memory_order_seq_cst);
  for (const WaitFor& w : waits) {
    auto* peer = static_cast<Peer*>(w.connection);
    if (w.recv && peer->available()) ready = true;
    if (w.send) fds.push_back({peer->send_fd(), POLLOUT, 0});
  }
  if (!ready) {
    timespec ts{time_t(max_sleep.count() / 1000000), long(max_sleep.count() % 1000000) * 1000};
    ::ppoll(fds.data(), fds.size(), &ts, nullptr);
  }
  waiting_.store(false, std::memory_order_seq_cst);
  uint64_t drained;
  while (::read(wakeup_fd_, &drained, sizeof drained) > 0) {
  }
}

void TcpTransport::ring_doorbell() {
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
    text += (text.empty() ? "" : ", ") + std::string("rank ") + std::to_string(h.rank) + " (" + std::to_string(ago) + " ms ago)";
  }
  return text;
}

std::string TcpTransport::dead_local_peers(bool skip_unread) const {
  std::string dead;
  for (size_t r = 0; r < local_pids_.size(); ++r) {
    if (local_pids_[r] <= 0 || process_alive(local_pids_[r])) continue;
    // Gone, but what it sent before it went is still in our ring: not a failure while it lasts
    // (the pid is looked at first, so bytes that arrive in between are seen).
    if (skip_unread && peers_[r] && peers_[r]->has_unread()) continue;
    dead += (dead.empty() ? "" : ", ") + std::to_string(r);
  }
  return dead;
}

void TcpTransport::check_peers(std::chrono::milliseconds stalled_for) {
  if (stalled_for < kHangupGrace) return;
  // A peer process that is gone and a rank that made no progress since: it died mid-collective
  // (a clean exit after the last collective leaves nothing waiting on it). A peer that sent its
  // last bytes and exited at once is no failure until those bytes are read: its receiver thread
  // drains the socket before it reports the hang-up, and peers with unread bytes are skipped.
  std::string dead = dead_local_peers(/*skip_unread=*/true);
  if (!dead.empty())
    TINYDDP_FAIL("tcp transport: rank(s) ", dead, " died (the process is gone) while rank ", rank_,
                 " waited in a collective with them; hint: look at rank ", dead.substr(0, dead.find(',')),
                 "'s output and exit status (killed by a signal? out of memory?)");
  std::lock_guard<std::mutex> lock(hangups_mutex_);
  const HangUp* first = nullptr;
  for (const HangUp& h : hangups_)
    if (!peers_[h.rank] || !peers_[h.rank]->has_unread()) {
      first = &h;
      break;
    }
  if (!first || Clock::now() - first->when < kHangupGrace) return;
  TINYDDP_FAIL("tcp transport: rank ", first->rank,
               " closed its connections (its process died or aborted) and rank ", rank_,
               " has made no progress since; ranks that hung up, first first: ", hangup_summary(),
               "; hint: look at rank ", first->rank, "'s own output for the first error");
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
               "; hint: look at rank ", first, "'s own output and exit status for the first error");
}

void TcpTransport::abort(const std::string& /*reason*/) {
  // Shutting the sockets down (not closing: the descriptors stay valid for this rank's threads)
  // sends every peer an EOF now, instead of after its timeout.
  for (auto& peer : peers_) {
    if (!peer) continue;
    peer->stop_receiving();
    ::shutdown(peer->send_fd(), SHUT_RDWR);
    ::shutdown(peer->recv_fd(), SHUT_RDWR);
  }
}

}  // namespace tinyddp::comm
