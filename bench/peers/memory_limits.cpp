// memory_limits: what one core of this host moves through memory, per buffer size: the bounds an
// all-reduce inside a host is held against (docs/how-ddp-works.md, "Bytes each rank moves").
//
//   build/bin/memory_limits [-b 64K] [-e 256M]
//
// For each size S, from -b to -e by factors of 4, the best of a few timed passes over buffers that
// stay allocated (so small sizes run from cache, as an all-reduce that reuses its buffer does):
//   memcpy   dst = src, S bytes (the C library's copy)        GB/s of S
//   a += b   over S/4 floats, one AVX2 loop                   GB/s of S (of a: reads 2S, writes S)
// Printed with the CPU model and the load, which every figure needs beside it on a shared host.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

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
  std::printf("# memory_limits: one core, %s, load %.2f\n#       bytes   memcpy GB/s   a+=b GB/s\n",
              cpu_model().c_str(), load[0]);
  for (size_t bytes = from; bytes <= to; bytes *= 4) {
    auto* a = static_cast<float*>(std::aligned_alloc(4096, bytes));
    auto* b = static_cast<float*>(std::aligned_alloc(4096, bytes));
    std::memset(a, 0, bytes);
    std::memset(b, 1, bytes);
    const double copy = best_rate(bytes, [&] { std::memcpy(a, b, bytes); });
    const double add = best_rate(bytes, [&] { add_into(a, b, bytes / 4); });
    std::printf("%13zu %13.2f %11.2f\n", bytes, copy, add);
    std::free(a);
    std::free(b);
  }
}
