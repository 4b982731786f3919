// tcp_limits: what loopback TCP can carry on this host, in the shapes an all-reduce uses it.
//
//   build/bin/tcp_limits [--gib 2] [--chunk 1M] [--buffer 0]
//
// A 2-rank all-reduce sends N bytes and receives N bytes on every rank, both directions at once
// (busbw = N / time = one direction's rate), and the kernel's loopback copies run on the same two
// cores as the ranks. So the ceiling for it is not one stream in one direction (the usual loopback
// figure) but two streams in opposite directions at once. This program measures, each for the same
// number of bytes per direction:
//   one stream          A -> B, a sender thread and a receiver thread
//   two streams, 4 thr  A -> B and B -> A at once, a thread per direction per end
//   two streams, 2 thr  the same with one thread per end driving both sockets (poll): the shape
//                       of a communication thread without receiver threads
//   two streams, 64 MiB the 4-thread line, but each end sends from and receives into buffers of a
//                       large message's size (--message) instead of one cache-resident chunk:
//                       the bytes of a 2-rank all-reduce of that size, moved through memory as
//                       it must move them, with no reduction at all. Not a strict ceiling (an
//                       all-reduce sends half its bytes right after reducing them, from cache),
//                       but the figure a large tcp all-reduce is compared with.
// Figures are payload bytes per second per direction (GB/s = 1e9 B/s).
#include <CLI/CLI.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tinyddp/core/command_line.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  size_t bytes = size_t(2) << 30;  // per direction
  size_t chunk = 1 << 20;          // bytes per send()/recv() call
  size_t message = 64 << 20;       // the buffers of the message-sized line
  int buffer = 0;                  // SO_SNDBUF/SO_RCVBUF; 0 keeps the kernel's auto-tuning
};

void tune(int fd, const Options& o) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (o.buffer > 0) {
    ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &o.buffer, sizeof o.buffer);
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &o.buffer, sizeof o.buffer);
  }
}

// A connected loopback pair: first = the connecting end, second = the accepted end.
std::pair<int, int> connected_pair(const Options& o) {
  int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(listener, 1) != 0 ||
      ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    throw std::runtime_error(std::string("tcp_limits: cannot listen on loopback: ") + std::strerror(errno));
  int a = ::socket(AF_INET, SOCK_STREAM, 0);
  tune(a, o);
  if (::connect(a, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
    throw std::runtime_error(std::string("tcp_limits: cannot connect: ") + std::strerror(errno));
  int b = ::accept(listener, nullptr, nullptr);
  tune(b, o);
  ::close(listener);
  return {a, b};
}

// Sends `total` bytes from `buffer`, going round it in o.chunk-sized calls.
void send_all(int fd, size_t total, const std::vector<char>& buffer, const Options& o) {
  for (size_t sent = 0; sent < total;) {
    size_t at = sent % buffer.size();
    ssize_t k = ::send(fd, buffer.data() + at, std::min({o.chunk, total - sent, buffer.size() - at}), MSG_NOSIGNAL);
    if (k <= 0) throw std::runtime_error(std::string("tcp_limits: send failed: ") + std::strerror(errno));
    sent += size_t(k);
  }
}

// Receives `total` bytes into `buffer`, going round it.
void recv_all(int fd, size_t total, std::vector<char>& buffer, const Options& o) {
  for (size_t got = 0; got < total;) {
    size_t at = got % buffer.size();
    ssize_t k = ::recv(fd, buffer.data() + at, std::min({o.chunk, total - got, buffer.size() - at}), 0);
    if (k <= 0) throw std::runtime_error(std::string("tcp_limits: recv failed: ") + std::strerror(errno));
    got += size_t(k);
  }
}

// One end driving both directions from one thread: send on `out`, receive on `in`, poll when stuck.
void duplex_one_thread(int out, int in, size_t total, const Options& o) {
  std::vector<char> tx(o.chunk, 1), rx(o.chunk);
  size_t sent = 0, got = 0;
  while (sent < total || got < total) {
    bool moved = false;
    if (sent < total) {
      ssize_t k = ::send(out, tx.data(), std::min(o.chunk, total - sent), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (k > 0) sent += size_t(k), moved = true;
    }
    if (got < total) {
      ssize_t k = ::recv(in, rx.data(), std::min(o.chunk, total - got), MSG_DONTWAIT);
      if (k > 0) got += size_t(k), moved = true;
      if (k == 0) throw std::runtime_error("tcp_limits: the peer closed early");
    }
    if (!moved) {
      pollfd fds[2] = {{out, short(sent < total ? POLLOUT : 0), 0}, {in, short(got < total ? POLLIN : 0), 0}};
      ::poll(fds, 2, 10);
    }
  }
}

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

double one_stream(const Options& o) {
  auto [a, b] = connected_pair(o);
  std::vector<char> tx(o.chunk, 1), rx_buffer(o.chunk);
  auto start = Clock::now();
  std::thread rx([&, b = b] { recv_all(b, o.bytes, rx_buffer, o); });
  send_all(a, o.bytes, tx, o);
  rx.join();
  double rate = double(o.bytes) / seconds_since(start) / 1e9;
  ::close(a);
  ::close(b);
  return rate;
}

// Two streams in opposite directions on two sockets (one per direction, as the tcp transport
// uses); returns the rate per direction. Each thread sends from or receives into a buffer of
// `buffer_bytes` (written before the clock starts, so no page is touched for the first time).
double two_streams(const Options& o, bool thread_per_direction, size_t buffer_bytes) {
  auto [ab_a, ab_b] = connected_pair(o);  // A sends on ab_a, B receives on ab_b
  auto [ba_b, ba_a] = connected_pair(o);  // B sends on ba_b, A receives on ba_a
  std::vector<std::vector<char>> buffers(4, std::vector<char>(buffer_bytes, 1));
  auto start = Clock::now();
  std::vector<std::thread> threads;
  if (thread_per_direction) {
    threads.emplace_back([&, fd = ab_a] { send_all(fd, o.bytes, buffers[0], o); });
    threads.emplace_back([&, fd = ab_b] { recv_all(fd, o.bytes, buffers[1], o); });
    threads.emplace_back([&, fd = ba_b] { send_all(fd, o.bytes, buffers[2], o); });
    threads.emplace_back([&, fd = ba_a] { recv_all(fd, o.bytes, buffers[3], o); });
  } else {
    threads.emplace_back([&, out = ab_a, in = ba_a] { duplex_one_thread(out, in, o.bytes, o); });
    threads.emplace_back([&, out = ba_b, in = ab_b] { duplex_one_thread(out, in, o.bytes, o); });
  }
  for (auto& t : threads) t.join();
  double rate = double(o.bytes) / seconds_since(start) / 1e9;
  for (int fd : {ab_a, ab_b, ba_a, ba_b}) ::close(fd);
  return rate;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tcp_limits: loopback TCP, one stream against two streams in opposite directions"};
  Options o;
  double gib = 2;
  app.add_option("--gib", gib, "GiB per direction and test");
  app.add_option("--chunk", o.chunk, "bytes per send()/recv() call");
  app.add_option("--buffer", o.buffer, "SO_SNDBUF/SO_RCVBUF in bytes (0: the kernel's auto-tuning)");
  app.add_option("--message", o.message, "buffer bytes of the message-sized two-stream line");
  if (auto code = tinyddp::command_line::parse(app, argc, argv)) return *code;
  o.bytes = size_t(gib * double(size_t(1) << 30));
  try {
    double one = one_stream(o);
    double two4 = two_streams(o, true, o.chunk);
    double two2 = two_streams(o, false, o.chunk);
    double message = two_streams(o, true, o.message);
    std::printf("# loopback TCP, %.2f GiB per direction, %zu-byte calls, buffers %s, %u CPUs\n", gib, o.chunk,
                o.buffer > 0 ? std::to_string(o.buffer).c_str() : "auto", std::thread::hardware_concurrency());
    std::printf("tcp one stream                 %6.2f GB/s\n", one);
    std::printf("tcp two streams, 4 threads     %6.2f GB/s per direction (%.2f both)\n", two4, 2 * two4);
    std::printf("tcp two streams, 2 threads     %6.2f GB/s per direction (%.2f both)\n", two2, 2 * two2);
    std::printf(
        "tcp two streams, %3zu MiB bufs  %6.2f GB/s per direction (%.2f both; the bytes of a %zu MiB all-reduce)\n",
        o.message >> 20, message, 2 * message, o.message >> 20);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
