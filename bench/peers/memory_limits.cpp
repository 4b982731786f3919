// memory_limits: what one core of this host moves through memory, and two cores exchanging, per buffer
// size: the bounds an all-reduce inside a host is held against (docs/how-ddp-works.md, "Bytes each rank
// moves").
//
//   build/bin/memory_limits [-b 64K] [-e 256M]
//
// For each size S, from -b to -e by factors of 4, the best of a few timed passes over buffers that
// stay allocated (so small sizes run from cache, as an all-reduce that reuses its buffer does):
//   memcpy   dst = src, S bytes (the C library's copy)        GB/s of S
//   a += b   over S/4 floats, one AVX2 loop                   GB/s of S (of a: reads 2S, writes S)
// and the same bytes as they cross between two cores:
//   2 cores  a two-rank two-shot all-reduce of S bytes done by two bare threads, each on a CPU of its
//            own: each writes its whole buffer (as backward writes a bucket), then, between two spin
//            barriers, adds the other's half into its own and writes the sums back into the
//            other's in the same pass (each of the other's lines taken once). As busbw GB/s
//            (S / time): the best of a few rounds, each on buffers of its own and giving its
//            median exchange (the rate moves between allocations, with where their pages land).
//            Half of what each core reads was last written by the other core, and every line it
//            writes into the other's buffer is one that core holds: the one-core columns count
//            neither, so at cache-resident sizes they bound the all-reduce from far above.
//            "-" when this process may run on one CPU only.
// Printed with the CPU model and the load, which every figure needs beside it on a shared host.
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

__attribute__((target_clones("avx2", "default"))) void add_into(float* __restrict a, const float* __restrict b,
                                                                size_t n) {
  for (size_t i = 0; i < n; ++i) a[i] += b[i];
}

size_t parse_size(const char* text) {
  char* end = nullptr;
  double v = std::strtod(text, &end);
  const std::string unit = end;
  const double k = unit == "K" ? 1024.0 : unit == "M" ? 1048576.0 : unit == "G" ? 1073741824.0 : 1.0;
  if (end == text || !(unit.empty() || k > 1)) {
    std::fprintf(stderr, "memory_limits: '%s' is not a size (examples: 64K, 256M)\n", text);
    std::exit(2);
  }
  return size_t(v * k);
}

__attribute__((target_clones("avx2", "default"))) void add_into_both(float* __restrict a, float* __restrict b,
                                                                     size_t n) {
  for (size_t i = 0; i < n; ++i) a[i] = b[i] = a[i] + b[i];
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

// The best GB/s of S bytes over passes that take about 0.2 s in all.
template <typename Pass>
double best_rate(size_t bytes, Pass&& pass) {
  pass();  // touch the pages, warm the caches
  const int reps = int(std::clamp<size_t>((size_t(64) << 20) / bytes, 1, 4096));
  double best = 0;
  for (int round = 0; round < 5; ++round) {
    auto t0 = Clock::now();
    for (int r = 0; r < reps; ++r) pass();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::max(best, double(bytes) * reps / s / 1e9);
  }
  return best;
}

// The first two CPUs this process may run on; fewer when it may run on fewer.
std::vector<int> two_cpus() {
  cpu_set_t set;
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE && cpus.size() < 2; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

// Two threads meeting: each says it reached `step`, then waits until the other has.
struct SpinBarrier {
  alignas(64) std::atomic<long> reached[2] = {};
  alignas(64) char pad = 0;
  void arrive_and_wait(int me, long step) {
    reached[me].store(step, std::memory_order_release);
    while (reached[1 - me].load(std::memory_order_acquire) < step) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
  }
};

// One round of the "2 cores" column on fresh buffers: busbw GB/s of its median exchange.
double two_core_round(size_t bytes, const std::vector<int>& cpus) {
  const size_t count = bytes / 4, half = count / 2;
  float* buffer[2];
  for (float*& b : buffer) {
    b = static_cast<float*>(std::aligned_alloc(4096, bytes));
    std::memset(b, 0, bytes);
  }
  const int exchanges = int(std::clamp<size_t>((size_t(64) << 20) / bytes, 5, 1000));
  std::vector<double> seconds;
  SpinBarrier barrier;
  auto rank = [&](int me) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpus[size_t(me)], &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);
    float* own = buffer[me];
    float* other = buffer[1 - me];
    const size_t first = size_t(me) * half, last = me ? count : half;
    long step = 0;
    for (int e = 0; e < exchanges; ++e) {
      std::fill(own, own + count, float(e + me));
      barrier.arrive_and_wait(me, ++step);
      const auto t0 = Clock::now();
      add_into_both(own + first, other + first, last - first);
      barrier.arrive_and_wait(me, ++step);
      if (me == 0) seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      barrier.arrive_and_wait(me, ++step);  // neither writes its buffer again while the other still copies
    }
  };
  std::thread first(rank, 0), second(rank, 1);  // not this thread: it keeps every CPU for the next size
  first.join();
  second.join();
  for (float* b : buffer) std::free(b);
  std::sort(seconds.begin(), seconds.end());
  return double(bytes) / seconds[seconds.size() / 2] / 1e9;
}

// The "2 cores" column (see the header), or 0 without two CPUs.
double two_core_rate(size_t bytes) {
  const std::vector<int> cpus = two_cpus();
  if (cpus.size() < 2) return 0;
  double best = 0;
  for (int round = 0; round < 5; ++round) best = std::max(best, two_core_round(bytes, cpus));
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  size_t from = 64 << 10, to = size_t(256) << 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "-b")
      from = parse_size(argv[i + 1]);
    else if (std::string(argv[i]) == "-e")
      to = parse_size(argv[i + 1]);
    else {
      std::fprintf(stderr, "memory_limits: unknown flag %s; usage: memory_limits [-b 64K] [-e 256M]\n", argv[i]);
      return 2;
    }
  }
  if (from < 64 || from > to) {
    std::fprintf(stderr, "memory_limits: -b must be at least 64 and at most -e\n");
    return 2;
  }
  double load[3] = {};
  if (getloadavg(load, 3) < 0) load[0] = -1;
  std::printf("# memory_limits: %s, load %.2f\n#       bytes   memcpy GB/s   a+=b GB/s   2 cores GB/s\n",
              cpu_model().c_str(), load[0]);
  for (size_t bytes = from; bytes <= to; bytes *= 4) {
    auto* a = static_cast<float*>(std::aligned_alloc(4096, bytes));
    auto* b = static_cast<float*>(std::aligned_alloc(4096, bytes));
    std::memset(a, 0, bytes);
    std::memset(b, 1, bytes);
    const double copy = best_rate(bytes, [&] { std::memcpy(a, b, bytes); });
    const double add = best_rate(bytes, [&] { add_into(a, b, bytes / 4); });
    std::free(a);
    std::free(b);
    const double pair = two_core_rate(bytes);
    if (pair > 0)
      std::printf("%13zu %13.2f %11.2f %14.2f\n", bytes, copy, add, pair);
    else
      std::printf("%13zu %13.2f %11.2f %14s\n", bytes, copy, add, "-");
  }
}
