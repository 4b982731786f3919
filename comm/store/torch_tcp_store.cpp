#include "tinyddp/comm/store/torch_tcp_store.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "tinyddp/core/env.h"
#include "tinyddp/core/error.h"
#include "tinyddp/core/short_list.h"

namespace tinyddp::comm {

namespace {

using Clock = std::chrono::steady_clock;

// The magic number of the current dialect's greeting.
constexpr uint32_t kValidationMagic = 0x3C85F7CE;
// The largest key and value a current (libuv) server accepts; it closes the connection past them.
constexpr size_t kMaxKeyBytes = 8 * 1024;
constexpr size_t kMaxValueBytes = 8 * 1024 * 1024;

void put_u64(std::string& out, uint64_t value) {
  for (int i = 0; i < 8; ++i) out += char(uint8_t(value >> (8 * i)));
}
void put_string(std::string& out, const std::string& text) {
  put_u64(out, text.size());
  out += text;
}
uint64_t read_u64(const std::string& bytes) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = value << 8 | uint8_t(bytes[size_t(i)]);
  return value;
}

int milliseconds_until(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return int(std::clamp<long long>(left, 0, 24 * 3600 * 1000));
}

double seconds(Store::Duration d) { return double(d.count()) / 1000.0; }

// How one socket operation ended.
enum class Io { ok, closed, timed_out, failed };

// Waits until `fd` is ready for `events`, or the deadline.
Io wait_ready(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int n = ::poll(&p, 1, milliseconds_until(deadline));
    if (n > 0) return Io::ok;
    if (n == 0) return Io::timed_out;
    if (errno != EINTR) return Io::failed;
  }
}

Io send_all(int fd, const std::string& bytes, Clock::time_point deadline) {
  for (size_t at = 0; at < bytes.size();) {
    ssize_t n = ::send(fd, bytes.data() + at, bytes.size() - at, MSG_NOSIGNAL);
    if (n > 0) {
      at += size_t(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (Io ready = wait_ready(fd, POLLOUT, deadline); ready != Io::ok) return ready;
    } else {
      return errno == EPIPE || errno == ECONNRESET ? Io::closed : Io::failed;
    }
  }
  return Io::ok;
}

Io receive_exactly(int fd, std::string& out, size_t bytes, Clock::time_point deadline) {
  out.assign(bytes, '\0');
  for (size_t at = 0; at < bytes;) {
    ssize_t n = ::recv(fd, out.data() + at, bytes - at, 0);
    if (n > 0) {
      at += size_t(n);
    } else if (n == 0) {
      return Io::closed;
    } else if (errno == EAGAIN || errno == EINTR) {
      if (Io ready = wait_ready(fd, POLLIN, deadline); ready != Io::ok) return ready;
    } else {
      return errno == ECONNRESET ? Io::closed : Io::failed;
    }
  }
  return Io::ok;
}

std::string describe(Io io) {
  switch (io) {
    case Io::ok: return "ok";
    case Io::closed: return "the server closed the connection";
    case Io::timed_out: return "no answer before the deadline";
    case Io::failed: return std::string("socket error: ") + std::strerror(errno);
  }
  return "?";
}

TorchStoreDialect dialect_from_environment() {
  // legacy: PyTorch 1.x and 2.0; current: later 2.x; unset: ask the server.
  return env::choice<TorchStoreDialect>("TINYDDP_TORCH_STORE_PROTOCOL", {{"legacy", TorchStoreDialect::legacy},
                                                                         {"current", TorchStoreDialect::current}})
      .value_or(TorchStoreDialect::unknown);
}

std::string quoted(const std::vector<std::string>& keys) { return short_list(keys, 6, in_quotes); }

}  // namespace

const char* torch_store_dialect_name(TorchStoreDialect dialect) {
  switch (dialect) {
    case TorchStoreDialect::unknown: return "unknown";
    case TorchStoreDialect::legacy: return "legacy (PyTorch 1.x)";
    case TorchStoreDialect::current: return "current (PyTorch 2.x)";
  }
  return "?";
}

TorchTcpStore::TorchTcpStore(std::string host, int port, TorchTcpStoreOptions options)
    : host_(std::move(host)), port_(port), options_(options) {
  TINYDDP_CHECK(port >= 1 && port <= 65535, "TorchTcpStore: port ", port, " is not a port",
                hint("MASTER_PORT must name the port torchrun's agent listens on"));
  timeout_ = options.timeout;
  dialect_ = options.dialect != TorchStoreDialect::unknown ? options.dialect : dialect_from_environment();
  std::lock_guard<std::mutex> lock(mutex_);
  connect_until(Clock::now() + timeout_);
}

TorchTcpStore::~TorchTcpStore() { disconnect(); }

std::string TorchTcpStore::address() const { return "PyTorch TCPStore " + host_ + ":" + std::to_string(port_); }

uint8_t TorchTcpStore::code(Op op) const {
  const bool legacy = dialect_ == TorchStoreDialect::legacy;
  switch (op) {
    case Op::set: return legacy ? 0 : 1;
    case Op::compare_set: return legacy ? 1 : 2;
    case Op::get: return legacy ? 2 : 3;
    case Op::add: return legacy ? 3 : 4;
    case Op::check: return legacy ? 4 : 5;
    case Op::num_keys: return legacy ? 6 : 7;
    case Op::delete_key: return 8;
    case Op::append: return 9;  // current dialect only
  }
  return 0xff;
}

std::string TorchTcpStore::request(Op op) const { return std::string(1, char(code(op))); }

void TorchTcpStore::disconnect() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

// One TCP connection to the server, non-blocking, or -1 with the reason in `why`.
int TorchTcpStore::open_socket(Clock::time_point deadline, std::string& why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = ::getaddrinfo(host_.c_str(), std::to_string(port_).c_str(), &hints, &found); rc != 0) {
    why = "cannot resolve '" + host_ + "': " + ::gai_strerror(rc);
    return -1;
  }
  int fd = -1;
  for (addrinfo* a = found; a && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int error = 0;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      error = errno;
      if (error == EINPROGRESS && wait_ready(fd, POLLOUT, deadline) == Io::ok) {
        socklen_t length = sizeof error;
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length);
      }
    }
    if (error != 0) {
      why = error == EINPROGRESS ? "timed out connecting" : std::strerror(error);
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(found);
  if (fd >= 0) {
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  return fd;
}

// The dialect question: a legacy `check` of zero keys (see the header).
TorchStoreDialect TorchTcpStore::ask_dialect(int fd, std::string& why) {
  std::string probe(1, char(4));
  put_u64(probe, 0);
  auto deadline = Clock::now() + options_.probe_timeout;
  if (Io sent = send_all(fd, probe, deadline); sent != Io::ok) {
    why = "sending the dialect question: " + describe(sent);
    return TorchStoreDialect::unknown;
  }
  std::string answer;
  Io got = receive_exactly(fd, answer, 1, deadline);
  if (got == Io::ok && answer[0] == 0) return TorchStoreDialect::legacy;
  if (got == Io::closed || got == Io::timed_out) return TorchStoreDialect::current;
  why = got == Io::ok ? "the server answered the dialect question with byte " + std::to_string(uint8_t(answer[0]))
                      : "the dialect question: " + describe(got);
  return TorchStoreDialect::unknown;
}

// Connects, retrying with backoff until the deadline (the agent may not listen yet), learns the
// dialect on the first connection, and greets a current server.
void TorchTcpStore::connect_until(Clock::time_point deadline) {
  const auto start = Clock::now();
  std::string why;
  auto backoff = std::chrono::milliseconds(10);
  while (fd_ < 0) {
    int fd = open_socket(deadline, why);
    if (fd >= 0 && dialect_ == TorchStoreDialect::unknown) {
      dialect_ = ask_dialect(fd, why);
      if (dialect_ != TorchStoreDialect::legacy) ::close(fd), fd = -1;  // a current server wants a fresh start
      if (dialect_ == TorchStoreDialect::current) continue;
    }
    if (fd >= 0 && dialect_ == TorchStoreDialect::current) {
      std::string greeting(1, char(0));
      for (int i = 0; i < 4; ++i) greeting += char(uint8_t(kValidationMagic >> (8 * i)));
      if (Io sent = send_all(fd, greeting, deadline); sent != Io::ok) {
        why = "greeting: " + describe(sent);
        ::close(fd), fd = -1;
      }
    }
    if (fd >= 0) {
      fd_ = fd;
      return;
    }
    if (Clock::now() + backoff >= deadline)
      TINYDDP_FAIL("cannot reach the ", address(), " after ",
                   seconds(std::chrono::duration_cast<Duration>(Clock::now() - start)), " s: ", why,
                   hint("under torchrun, MASTER_ADDR/MASTER_PORT name its agent's store; is the agent "
                        "still running, and is the address reachable from this host?"));
    std::this_thread::sleep_for(backoff);
    backoff = std::min<std::chrono::milliseconds>(backoff * 2, std::chrono::seconds(1));
  }
}

void TorchTcpStore::ensure_connected() {
  if (fd_ < 0) connect_until(Clock::now() + timeout_);
}

std::string TorchTcpStore::exchange(const std::string& bytes, size_t reply_bytes, Clock::time_point deadline,
                                    const std::string& what) {
  ensure_connected();
  auto fail = [&](Io io) {
    disconnect();
    TINYDDP_FAIL(what, " at the ", address(), ": ", describe(io),
                 hint("the process hosting the store (torchrun's agent) may have exited or restarted the job"));
  };
  if (Io sent = send_all(fd_, bytes, deadline); sent != Io::ok) fail(sent);
  std::string reply;
  if (reply_bytes == 0) return reply;
  if (reply_bytes == kStringReply) {
    if (Io got = receive_exactly(fd_, reply, 8, deadline); got != Io::ok) fail(got);
    uint64_t length = read_u64(reply);
    if (length > kMaxValueBytes) {
      disconnect();
      TINYDDP_FAIL(what, " at the ", address(), ": the reply claims ", length, " bytes, more than any value",
                   hint("is MASTER_PORT really the port of torchrun's store?"));
    }
    reply_bytes = size_t(length);
  }
  if (Io got = receive_exactly(fd_, reply, reply_bytes, deadline); got != Io::ok) fail(got);
  return reply;
}

// PyTorch's server has a `wait`, but it wakes a waiting client only when a key is set or added, not
// when compare_set creates it -- and compare_set is how ranks claim their keys. So waiting here is
// asking `check` until the keys are there, quickly at first, then every 50 ms.
bool TorchTcpStore::wait_locked(const std::vector<std::string>& keys, Clock::time_point deadline,
                                const std::string& what) {
  std::string bytes = request(Op::check);
  put_u64(bytes, keys.size());
  for (const auto& key : keys) put_string(bytes, key);
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    if (exchange(bytes, 1, deadline, what)[0] == 0) return true;
    if (Clock::now() + pause >= deadline) return false;
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::milliseconds>(pause * 2, std::chrono::milliseconds(50));
  }
}

bool TorchTcpStore::check_locked(const std::vector<std::string>& keys, Clock::time_point deadline) {
  std::string bytes = request(Op::check);
  put_u64(bytes, keys.size());
  for (const auto& key : keys) put_string(bytes, key);
  return exchange(bytes, 1, deadline, "check(" + quoted(keys) + ")")[0] == 0;
}

std::string TorchTcpStore::get_locked(const std::string& key, Clock::time_point deadline) {
  // The server answers get only for a key that exists (it hangs up otherwise): wait for it first.
  if (!wait_locked({key}, deadline, "get('" + key + "')"))
    TINYDDP_FAIL("get('", key, "') at the ", address(), ": the key did not appear within ", seconds(timeout_), " s",
                 hint("the rank that sets it has not come, or failed before setting it"));
  std::string bytes = request(Op::get);
  put_string(bytes, key);
  return exchange(bytes, kStringReply, deadline, "get('" + key + "')");
}

void TorchTcpStore::set(const std::string& key, const std::string& value) {
  TINYDDP_CHECK(key.size() <= kMaxKeyBytes && value.size() <= kMaxValueBytes, "set('", key.substr(0, 64),
                "'): ", key.size(), "-byte key, ", value.size(), "-byte value: over the limits of PyTorch's store (",
                kMaxKeyBytes, " and ", kMaxValueBytes, ")", hint("split the value over several keys"));
  std::lock_guard<std::mutex> lock(mutex_);
  auto deadline = Clock::now() + timeout_;
  std::string bytes = request(Op::set);
  put_string(bytes, key);
  put_string(bytes, value);
  exchange(bytes, 0, deadline, "set('" + key + "')");
  // `set` has no reply. One question more, so that the key is in the store when set() returns (the
  // server answers requests of a connection in order).
  exchange(request(Op::num_keys), 8, deadline, "set('" + key + "')");
}

std::string TorchTcpStore::get(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  return get_locked(key, Clock::now() + timeout_);
}

int64_t TorchTcpStore::add(const std::string& key, int64_t delta) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string bytes = request(Op::add);
  put_string(bytes, key);
  put_u64(bytes, uint64_t(delta));
  return int64_t(read_u64(exchange(bytes, 8, Clock::now() + timeout_, "add('" + key + "')")));
}

std::string TorchTcpStore::compare_set_locked(const std::string& key, const std::string& expected,
                                              const std::string& desired) {
  auto deadline = Clock::now() + timeout_;
  std::string bytes = request(Op::compare_set);
  put_string(bytes, key);
  put_string(bytes, expected);
  put_string(bytes, desired);
  std::string after = exchange(bytes, kStringReply, deadline, "compare_set('" + key + "')");
  // For a missing key and a non-empty `expected`, PyTorch's server answers `expected` itself; our
  // Store says "" there (the value of a key that stays missing). A present key equal to `expected`
  // would have become `desired`, so `expected` back means missing, unless the two are the same.
  if (expected.empty() || after != expected) return after;
  if (expected != desired) return "";
  return check_locked({key}, deadline) ? after : "";
}

std::string TorchTcpStore::compare_set(const std::string& key, const std::string& expected,
                                       const std::string& desired) {
  std::lock_guard<std::mutex> lock(mutex_);
  return compare_set_locked(key, expected, desired);
}

bool TorchTcpStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mutex_);
  return check_locked(keys, Clock::now() + timeout_);
}

void TorchTcpStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (wait_locked(keys, Clock::now() + timeout, "wait(" + quoted(keys) + ")")) return;
  std::vector<std::string> missing;
  auto deadline = Clock::now() + std::min<Duration>(timeout_, std::chrono::seconds(10));
  for (const auto& key : keys)
    if (!check_locked({key}, deadline)) missing.push_back(key);
  TINYDDP_FAIL("wait at the ", address(), ": timed out after ", seconds(timeout),
               " s; still missing: ", quoted(missing), hint("the ranks that set them have not come, or failed first"));
}

bool TorchTcpStore::delete_key(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string bytes = request(Op::delete_key);
  put_string(bytes, key);
  return read_u64(exchange(bytes, 8, Clock::now() + timeout_, "delete_key('" + key + "')")) > 0;
}

int64_t TorchTcpStore::num_keys() {
  std::lock_guard<std::mutex> lock(mutex_);
  return int64_t(read_u64(exchange(request(Op::num_keys), 8, Clock::now() + timeout_, "num_keys()")));
}

void TorchTcpStore::append(const std::string& key, const std::string& value) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto deadline = Clock::now() + timeout_;
  if (dialect_ == TorchStoreDialect::current) {
    std::string bytes = request(Op::append);
    put_string(bytes, key);
    put_string(bytes, value);
    exchange(bytes, 0, deadline, "append('" + key + "')");
    exchange(request(Op::num_keys), 8, deadline, "append('" + key + "')");
    return;
  }
  // The legacy server has no append: read the value and swap in the longer one, again if another
  // client appended in between.
  if (value.empty()) return;
  while (Clock::now() < deadline) {
    std::string before = check_locked({key}, deadline) ? get_locked(key, deadline) : "";
    if (compare_set_locked(key, before, before + value) == before + value) return;
  }
  TINYDDP_FAIL("append('", key, "') at the ", address(), ": other clients kept changing the key for ",
               seconds(timeout_), " s", hint("raise the store timeout"));
}

std::vector<std::string> TorchTcpStore::multi_get(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto deadline = Clock::now() + timeout_;
  std::vector<std::string> values;
  for (const auto& key : keys) values.push_back(get_locked(key, deadline));
  return values;
}

void TorchTcpStore::multi_set(const std::vector<std::string>& keys, const std::vector<std::string>& values) {
  TINYDDP_CHECK(keys.size() == values.size(), "multi_set: ", keys.size(), " keys but ", values.size(), " values",
                hint("give one value per key"));
  for (size_t i = 0; i < keys.size(); ++i) set(keys[i], values[i]);
}

}  // namespace tinyddp::comm
