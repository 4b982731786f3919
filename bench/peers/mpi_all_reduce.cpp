// mpi_all_reduce: Open MPI's all-reduce, measured as bench/all_reduce_perf measures ours, so that
// bench/compare_symmetric.sh can run both in one command and divide.
//
//   mpirun -np 2 build/bin/mpi_all_reduce [-b 1K] [-e 256M] [-f 4] [-n 20] [-w 5] [--rewrite 1]
//
// In place (MPI_IN_PLACE), float32 sum, sizes from -b to -e multiplying by -f. Each size: -w warm-up
// calls, a barrier, -n timed calls back to back (MPI_Allreduce blocks, so each waits for the one
// before: nccl-tests' -z 1), the mean time over the ranks; then the inputs are written again, one
// more call is checked element by element against the closed form (#wrong). Rows as every peer
// program prints them (bench/peers/run_local.sh):  bytes  time_us  algbw  busbw (GB/s), then #wrong;
// busbw = algbw * 2(n-1)/n as nccl-tests has it. --rewrite 1: each rank writes its input before every
// timed call and the writes' time is left out, as all_reduce_perf's --rewrite 1 does.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

size_t parse_size(const char* flag, const char* text) {
  char* end = nullptr;
  const double v = std::strtod(text, &end);
  const std::string unit = end;
  const double k = unit == "K"    ? 1024.0
                   : unit == "M"  ? 1048576.0
                   : unit == "G"  ? 1073741824.0
                   : unit.empty() ? 1.0
                                  : -1.0;
  if (end == text || k < 0 || v < 0) {
    std::fprintf(stderr, "mpi_all_reduce: %s '%s' is not a size (examples: 8, 64K, 1M)\n", flag, text);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  return size_t(v * k);
}

// Rank r's input at element i, and the sum over n ranks: small integers, exact in float.
float input(int rank, size_t i) { return float((rank + 1) * int(i % 7 + 1) - 3); }
float expected(int world, size_t i) { return float(int(i % 7 + 1) * world * (world + 1) / 2 - 3 * world); }

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  size_t min_bytes = 1024, max_bytes = size_t(256) << 20, factor = 4;
  int iters = 20, warmup = 5;
  bool rewrite = false;
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) {
      if (rank == 0) std::fprintf(stderr, "mpi_all_reduce: %s needs a value\n", flag.c_str());
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    if (flag == "-b")
      min_bytes = parse_size("-b", argv[i + 1]);
    else if (flag == "-e")
      max_bytes = parse_size("-e", argv[i + 1]);
    else if (flag == "-f")
      factor = size_t(std::max(2, std::atoi(argv[i + 1])));
    else if (flag == "-n")
      iters = std::max(1, std::atoi(argv[i + 1]));
    else if (flag == "-w")
      warmup = std::max(0, std::atoi(argv[i + 1]));
    else if (flag == "--rewrite" && (std::string(argv[i + 1]) == "0" || std::string(argv[i + 1]) == "1"))
      rewrite = argv[i + 1][0] == '1';
    else if (flag == "--rewrite") {
      if (rank == 0) std::fprintf(stderr, "mpi_all_reduce: --rewrite takes 0 or 1, not '%s'\n", argv[i + 1]);
      MPI_Abort(MPI_COMM_WORLD, 2);
    } else {
      if (rank == 0)
        std::fprintf(stderr, "mpi_all_reduce: unknown flag %s; flags: -b -e -f -n -w --rewrite\n", flag.c_str());
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }
  if (rank == 0)
    std::printf(
        "# mpi_all_reduce: Open MPI MPI_Allreduce, in place, float sum, %d ranks\n"
        "#%11s %12s %8s %8s %6s\n",
        world, "bytes", "time_us", "algbw", "busbw", "#wrong");
  std::vector<float> buf(std::max<size_t>(max_bytes / 4, 1)), original(rewrite ? buf.size() : 0);
  for (size_t bytes = std::max<size_t>(min_bytes, 4); bytes <= max_bytes; bytes *= factor) {
    const size_t count = bytes / 4;
    for (size_t i = 0; i < count; ++i) buf[i] = input(rank, i);  // written once: the pages are real
    if (rewrite) std::copy(buf.begin(), buf.begin() + long(count), original.begin());
    for (int i = 0; i < warmup; ++i)
      MPI_Allreduce(MPI_IN_PLACE, buf.data(), int(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    std::chrono::steady_clock::duration rewriting{};
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) {
      if (rewrite) {
        const auto begin = std::chrono::steady_clock::now();
        std::copy(original.begin(), original.begin() + long(count), buf.begin());
        rewriting += std::chrono::steady_clock::now() - begin;
      }
      MPI_Allreduce(MPI_IN_PLACE, buf.data(), int(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0 - rewriting).count() / iters,
           total = 0;
    MPI_Allreduce(&seconds, &total, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    seconds = total / world;
    for (size_t i = 0; i < count; ++i) buf[i] = input(rank, i);
    MPI_Allreduce(MPI_IN_PLACE, buf.data(), int(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    long long wrong = 0, all_wrong = 0;
    for (size_t i = 0; i < count; ++i) wrong += buf[i] != expected(world, i);
    MPI_Allreduce(&wrong, &all_wrong, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    const double algbw = double(bytes) / seconds / 1e9;
    if (rank == 0)
      std::printf("%12zu %12.2f %8.3f %8.3f %6lld\n", bytes, seconds * 1e6, algbw, algbw * 2.0 * (world - 1) / world,
                  all_wrong);
    std::fflush(stdout);
    if (bytes > max_bytes / factor) break;
  }
  MPI_Finalize();
}
