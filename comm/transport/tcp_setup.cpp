#include "tinyddp/comm/transport/tcp_setup.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <optional>
#include <thread>
#include <utility>

#include "tinyddp/core/error.h"
#include "tinyddp/core/hash.h"
#include "tinyddp/core/log.h"

namespace tinyddp::comm {

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kMagic = 0x50444454;  // "TDDP"
constexpr uint16_t kVersion = 2;
constexpr uint8_t kHello = 0, kAccepted = 1;
// The two sockets of a pair (see the header): the connecting (higher) rank sends on the upward one.
constexpr uint8_t kUpward = 0, kDownward = 1;

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

int remaining_ms(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return int(std::clamp<long long>(left, 0, 1 << 30));
}

// Sends (`sending`) or receives exactly `n` bytes, waiting for the socket at most until `deadline`:
// the handshake's blocking-with-deadline transfer (the data path is non-blocking).
bool transfer_all(int fd, void* data, size_t n, bool sending, Clock::time_point deadline) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t k = sending ? ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT) : ::recv(fd, p, n, MSG_DONTWAIT);
    if (k > 0) {
      p += k;
      n -= size_t(k);
    } else if (k < 0 && (errno == EAGAIN || errno == EINTR)) {
      pollfd wait{fd, short(sending ? POLLOUT : POLLIN), 0};
      int rc = ::poll(&wait, 1, remaining_ms(deadline));
      if (rc == 0 || (rc < 0 && errno != EINTR)) return false;
    } else {
      return false;
    }
  }
  return true;
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

// The mesh while it is being set up, shared by the steps below. Its destructor closes the listener
// and every socket that was not handed over: a setup that throws leaves nothing open.
struct Mesh {
  const MeshSpec& spec;
  const uint64_t group, token;  // the digests every handshake carries
  const Clock::time_point deadline;
  int listener = -1;
  std::string advertised;                   // "address:port", as published
  std::vector<std::array<int, 2>> sockets;  // [peer][channel]; -1 until connected

  explicit Mesh(const MeshSpec& s)
      : spec(s),
        group(fnv1a(s.prefix)),
        token(fnv1a(s.token)),
        deadline(Clock::now() + s.timeout),
        sockets(size_t(s.world_size), {-1, -1}) {}
  ~Mesh() {
    if (listener >= 0) ::close(listener);
    for (auto& pair : sockets)
      for (int fd : pair)
        if (fd >= 0) ::close(fd);
  }
  std::string rank_text() const { return std::to_string(spec.rank); }
  bool connected(int peer) const {
    return sockets[size_t(peer)][kUpward] >= 0 && sockets[size_t(peer)][kDownward] >= 0;
  }
  // A socket of `peer`'s pair is connected and its handshake done.
  void add(int peer, uint8_t channel, int fd) {
    tune_socket(fd, spec.socket_buffer_bytes);
    set_nonblocking(fd);
    sockets[size_t(peer)][channel] = fd;
  }
  // The finished pairs, given up by the mesh. The higher rank connected: it sends upward and
  // receives downward; the lower rank the reverse.
  std::vector<SocketPair> hand_over() {
    std::vector<SocketPair> pairs(sockets.size());
    for (int p : spec.peers) {
      const bool connector = p < spec.rank;
      pairs[size_t(p)] = {sockets[size_t(p)][connector ? kUpward : kDownward],
                          sockets[size_t(p)][connector ? kDownward : kUpward]};
      sockets[size_t(p)] = {-1, -1};
    }
    return pairs;
  }
};

// Step 1: listen (on spec.listen_on, or every address with bind_all) and publish where.
void listen_and_publish(Mesh& mesh, Store& store) {
  const MeshSpec& spec = mesh.spec;
  mesh.listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);  // non-blocking: see Knock::accept
  TINYDDP_CHECK(mesh.listener >= 0, "tcp transport: socket() failed: ", errno_text(errno),
                hint("check the open-file limit (ulimit -n)"));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  if (spec.bind_all) {
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
  } else {
    TINYDDP_CHECK(::inet_pton(AF_INET, spec.listen_on.c_str(), &addr.sin_addr) == 1, "tcp transport: rank ", spec.rank,
                  " would listen on '", spec.listen_on, "', which is not an IPv4 address",
                  hint("set TINYDDP_SOCKET_ADDR ", "to this host's IPv4 address (or TINYDDP_IFNAME to its interface)"));
  }
  socklen_t len = sizeof addr;
  if (::bind(mesh.listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(mesh.listener, 128) != 0 || ::getsockname(mesh.listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    TINYDDP_FAIL("tcp transport: rank ", spec.rank, " could not listen on ",
                 spec.bind_all ? std::string("every address") : spec.listen_on, ": ", errno_text(errno),
                 hint("the address must belong to this host (TINYDDP_SOCKET_ADDR / TINYDDP_IFNAME pick it)"));
  mesh.advertised = spec.listen_on + ":" + std::to_string(ntohs(addr.sin_port));
  store.set(spec.prefix + "tcp/" + mesh.rank_text(), mesh.advertised);
}

// Connects to `to`, retrying with a growing pause until the deadline (the peer may not listen yet).
int dial(const Mesh& mesh, const sockaddr_in& to, int peer, const std::string& where) {
  for (int attempt = 0;; ++attempt) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof to) == 0) return fd;
    int err = errno;
    ::close(fd);
    TINYDDP_CHECK(Clock::now() < mesh.deadline, "tcp transport: rank ", mesh.spec.rank, " could not connect to rank ",
                  peer, " at ", where, ": ", errno_text(err),
                  hint("check that the hosts reach each other on that ",
                       "address (TINYDDP_SOCKET_ADDR picks it) and that no firewall blocks it"));
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(100, 1 << std::min(attempt, 6))));
  }
}

// Step 2: connect to every lower rank, both sockets, and wait for its acceptance.
void connect_to_lower_ranks(Mesh& mesh, Store& store) {
  const MeshSpec& spec = mesh.spec;
  for (int p : spec.peers) {
    if (p > spec.rank) continue;
    // The address the peer listens on, even on this host: a peer with ranks on other hosts listens
    // only on the interface facing them (a connection to it from here still stays inside the host).
    const std::string where = store.get(spec.prefix + "tcp/" + std::to_string(p));
    const std::string host = where.substr(0, where.rfind(':'));
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(uint16_t(std::stoi(where.substr(where.rfind(':') + 1))));
    TINYDDP_CHECK(::inet_pton(AF_INET, host.c_str(), &to.sin_addr) == 1, "tcp transport: rank ", p,
                  " published the address '", where, "', which is not IPv4 host:port",
                  hint("set TINYDDP_SOCKET_ADDR ", "to this host's IPv4 address"));
    for (uint8_t channel : {kUpward, kDownward}) {
      int fd = dial(mesh, to, p, where);
      Handshake hello{kMagic, kVersion, kHello, channel, spec.rank, p, mesh.group, mesh.token};
      Handshake reply{};
      bool ok = transfer_all(fd, &hello, sizeof hello, true, mesh.deadline) &&
                transfer_all(fd, &reply, sizeof reply, false, mesh.deadline);
      if (!ok || reply.magic != kMagic || reply.kind != kAccepted || reply.from != p || reply.channel != channel) {
        ::close(fd);
        TINYDDP_FAIL("tcp transport: rank ", p, " at ", where, " refused or did not answer rank ", spec.rank,
                     "'s handshake",
                     hint("every rank needs the same TINYDDP_TOKEN and the same tinyddp version, and the "
                          "address must belong to this job (its log says why it refused)"));
      }
      mesh.add(p, channel, fd);
    }
  }
}

// Why a complete handshake is refused ("" when it is one of this rank's expected connections).
std::string refusal_for(const Mesh& mesh, const Handshake& hello) {
  const MeshSpec& spec = mesh.spec;
  if (hello.magic != kMagic) return "not a tinyddp transport handshake (wrong magic)";
  if (hello.version != kVersion)
    return "protocol version " + std::to_string(hello.version) + ", this rank speaks " + std::to_string(kVersion);
  if (hello.token != mesh.token) return "wrong job token (TINYDDP_TOKEN differs)";
  if (hello.group != mesh.group) return "it belongs to another process group or job";
  if (hello.to != spec.rank) return "it wanted rank " + std::to_string(hello.to);
  if (hello.from <= spec.rank || hello.from >= spec.world_size ||
      std::find(spec.peers.begin(), spec.peers.end(), int(hello.from)) == spec.peers.end())
    return "rank " + std::to_string(hello.from) + " is not a peer that connects to this rank";
  if (hello.channel > kDownward) return "unknown channel " + std::to_string(hello.channel);
  if (mesh.sockets[size_t(hello.from)][hello.channel] >= 0)
    return "rank " + std::to_string(hello.from) + " is connected already";
  return "";
}

void refuse(const Mesh& mesh, Knock& knock, const std::string& reason) {
  log_line(LogLevel::warn, "tcp-transport",
           "rank " + mesh.rank_text() + " refused a connection from " + knock.source + ": " + reason);
  ::close(knock.fd);
  knock.fd = -1;
}

// A whole handshake arrived: let the rank in (answer it) or refuse it. True when a socket was added.
bool admit(Mesh& mesh, Knock& knock) {
  if (std::string reason = refusal_for(mesh, knock.hello); !reason.empty()) {
    refuse(mesh, knock, reason);
    return false;
  }
  Handshake reply{kMagic,         kVersion,         kAccepted,  knock.hello.channel,
                  mesh.spec.rank, knock.hello.from, mesh.group, mesh.token};
  int fd = std::exchange(knock.fd, -1);
  if (!transfer_all(fd, &reply, sizeof reply, true, mesh.deadline)) {
    ::close(fd);
    return false;
  }
  mesh.add(knock.hello.from, knock.hello.channel, fd);
  return true;
}

// The connections accepted on the listener whose handshakes are still being heard. Whatever is left
// when the setup ends (or fails) is closed.
struct Knocks {
  std::vector<Knock> list;
  ~Knocks() {
    for (Knock& knock : list)
      if (knock.fd >= 0) ::close(knock.fd);
  }
};

[[noreturn]] void fail_missing(const Mesh& mesh) {
  std::string missing;
  for (int p : mesh.spec.peers)
    if (p > mesh.spec.rank && !mesh.connected(p)) missing += (missing.empty() ? "" : ", ") + std::to_string(p);
  TINYDDP_FAIL("tcp transport: rank ", mesh.spec.rank, " timed out after ", mesh.spec.timeout.count(),
               " ms waiting for rank(s) ", missing, " to connect",
               hint("those ranks did not start, failed earlier, or ", "cannot reach ", mesh.advertised));
}

// Step 3: accept every higher rank (two sockets each). Anything else that knocks is refused with a
// logged reason. Every knock is heard at once with poll(), each with its own grace, so one that
// stays silent holds up nobody else: the real ranks get in as soon as their 32 bytes arrive.
void accept_higher_ranks(Mesh& mesh) {
  const std::vector<int>& peers = mesh.spec.peers;
  int expected = 2 * int(std::count_if(peers.begin(), peers.end(), [&](int p) { return p > mesh.spec.rank; }));
  Knocks knocks;
  while (expected > 0) {
    const auto now = Clock::now();
    for (Knock& knock : knocks.list)
      if (now >= knock.grace_ends) refuse(mesh, knock, "no handshake within 5 s (" + knock.progress() + ")");
    std::erase_if(knocks.list, [](const Knock& k) { return k.fd < 0; });
    if (now >= mesh.deadline) fail_missing(mesh);

    // Sleep until the listener or a knock has something, or the next grace or the deadline ends.
    // At kMaxKnocks unheard sockets the listener is left out: newcomers wait in its backlog.
    auto wake = mesh.deadline;
    std::vector<pollfd> fds{{knocks.list.size() < kMaxKnocks ? mesh.listener : -1, POLLIN, 0}};
    for (const Knock& knock : knocks.list) {
      fds.push_back({knock.fd, POLLIN, 0});
      wake = std::min(wake, knock.grace_ends);
    }
    if (::poll(fds.data(), fds.size(), remaining_ms(wake) + 1) <= 0) continue;  // timeouts, EINTR: looked at above

    for (size_t i = 0; i < knocks.list.size(); ++i) {
      if (fds[i + 1].revents == 0) continue;
      Knock& knock = knocks.list[i];
      switch (knock.hear()) {
        case Knock::Heard::more: break;
        case Knock::Heard::hung_up:
          refuse(mesh, knock, "no handshake within 5 s (it hung up after " + knock.progress() + ")");
          break;
        case Knock::Heard::all: expected -= admit(mesh, knock) ? 1 : 0; break;
      }
    }
    if (fds[0].revents != 0)
      while (knocks.list.size() < kMaxKnocks) {
        std::optional<Knock> knock = Knock::accept(mesh.listener,
                                                   std::min(mesh.deadline, Clock::now() + kHandshakeGrace));
        if (!knock) break;
        knocks.list.push_back(std::move(*knock));
      }
  }
  // Every rank is in: whoever is still mid-handshake cannot be one of them (a second connection
  // for a rank would be refused as "connected already"), and the group does not wait for it.
  for (Knock& knock : knocks.list)
    if (knock.fd >= 0)
      refuse(mesh, knock,
             "no handshake yet when every rank had joined (" + knock.progress() +
                 "); the group does not wait out a stranger's 5 s grace");
}

}  // namespace

std::vector<SocketPair> connect_mesh(Store& store, const MeshSpec& spec) {
  Mesh mesh(spec);
  listen_and_publish(mesh, store);
  connect_to_lower_ranks(mesh, store);
  accept_higher_ranks(mesh);
  return mesh.hand_over();
}

std::string errno_text(int err) { return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")"; }

}  // namespace tinyddp::comm
