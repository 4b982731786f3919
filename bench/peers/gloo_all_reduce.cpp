// gloo_all_reduce: Gloo's all-reduce over its TCP transport, without PyTorch around it. The peer of
// `all_reduce_perf --transport tcp`; PyTorch's gloo backend calls the same library
// (bench/peers/torch_all_reduce.py). float32 sum, in place, Gloo's ring, sizes --min-bytes to
// --max-bytes by x4.
//
//   RANK=r WORLD_SIZE=n build/bin/gloo_all_reduce --store DIR [--min-bytes 1024] [--max-bytes 256M]
//
// One process per rank, RANK and WORLD_SIZE in its environment as a launcher sets them. The ranks meet
// through files in DIR (Gloo's FileStore): a folder every rank sees, empty at the start. Each rank
// listens on --address (GLOO_HOSTNAME, else 127.0.0.1). bench/peers/run_local.sh starts the ranks on
// one host; bench/compare_cluster.sh on simulated hosts.
//
// Rank 0 prints a line "# gloo allreduce ..." and then a row per size: bytes, time_us, algbw GB/s and
// busbw GB/s (algbw * 2(n-1)/n, nccl-tests' definition), the rows bench/peers/ programs all print. The
// time is rank 0's mean over the timed calls, after 2 warm-up calls and a barrier. Before timing a
// size, every rank all-reduces rank + 1 once and checks that each element came back as n(n+1)/2: a
// wrong result ends the run with a message, never a row.
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

struct Options {
  int rank = -1;
  int world = -1;
  std::string store;
  std::string address = std::getenv("GLOO_HOSTNAME") ? std::getenv("GLOO_HOSTNAME") : "127.0.0.1";
  size_t min_bytes = 1024;
  size_t max_bytes = size_t(256) << 20;
  int iters = 50;
  int timeout_s = 300;
};

// RANK or WORLD_SIZE from the environment; -1 when unset, an error when not a number.
int from_environment(const char* name) {
  const char* text = std::getenv(name);
  if (!text) return -1;
  char* end = nullptr;
  long value = std::strtol(text, &end, 10);
  if (*text == '\0' || *end != '\0' || value < 0 || value > 1 << 20)
    throw std::invalid_argument(std::string("gloo_all_reduce: ") + name + "='" + text + "' is not a rank count");
  return int(value);
}

// At most `most` timed calls, fewer for large sizes (about 2 GB moved per size), at least 2.
int iterations(size_t nbytes, int most) {
  return int(std::max<size_t>(2, std::min<size_t>(size_t(most), size_t(2'000'000'000) / nbytes)));
}

using ReduceFunction = void (*)(void*, const void*, const void*, size_t);

// The options of an in-place float32 sum over `data`, made once per size and used for every call: they
// hold the buffer's registration with the transport, which costs more than a small all-reduce.
std::unique_ptr<gloo::AllreduceOptions> sum_in_place(const std::shared_ptr<gloo::Context>& context,
                                                     std::vector<float>& data) {
  auto options = std::make_unique<gloo::AllreduceOptions>(context);
  options->setOutput(data.data(), data.size());
  options->setReduceFunction(static_cast<ReduceFunction>(&gloo::sum<float>));
  options->setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
  return options;
}

void check(gloo::AllreduceOptions& all_reduce, std::vector<float>& data, const Options& o) {
  std::fill(data.begin(), data.end(), float(o.rank + 1));
  gloo::allreduce(all_reduce);
  const float expected = float(o.world) * float(o.world + 1) / 2;
  size_t wrong = size_t(std::count_if(data.begin(), data.end(), [&](float x) { return x != expected; }));
  if (wrong > 0)
    throw std::runtime_error("gloo_all_reduce: rank " + std::to_string(o.rank) + ": " + std::to_string(wrong) + " of " +
                             std::to_string(data.size()) + " elements are not " + std::to_string(expected) +
                             " after all-reducing rank + 1 over " + std::to_string(o.world) + " ranks");
}

void run(const Options& o) {
  gloo::transport::tcp::attr attr;
  attr.hostname = o.address;
  auto device = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore store(o.store);
  auto context = std::make_shared<gloo::rendezvous::Context>(o.rank, o.world);
  context->setTimeout(std::chrono::seconds(o.timeout_s));  // every wait below: connecting, each collective
  try {
    context->connectFullMesh(store, device);
  } catch (const std::exception& e) {
    throw std::runtime_error("the " + std::to_string(o.world) + " ranks did not all meet in " + o.store + " within " +
                             std::to_string(o.timeout_s) + " s (--timeout): " + e.what());
  }
  if (o.rank == 0)
    std::printf(
        "# gloo allreduce (ring, tcp), float32 sum, in place, world=%d\n"
        "#       bytes      time_us  algbw    busbw\n",
        o.world);
  for (size_t nbytes = o.min_bytes; nbytes <= o.max_bytes; nbytes *= 4) {
    std::vector<float> data(nbytes / 4);
    auto all_reduce = sum_in_place(context, data);
    check(*all_reduce, data, o);
    std::fill(data.begin(), data.end(), 0.0f);  // repeated in-place sums of ones would grow to inf at many ranks
    for (int i = 0; i < 2; ++i) gloo::allreduce(*all_reduce);
    gloo::BarrierOptions barrier(context);
    gloo::barrier(barrier);
    const int n = iterations(nbytes, o.iters);
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) gloo::allreduce(*all_reduce);
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / n;
    if (o.rank == 0) {
      double algbw = double(nbytes) / seconds / 1e9;
      std::printf("%12zu %12.1f %8.3f %8.3f\n", nbytes, seconds * 1e6, algbw, algbw * 2 * (o.world - 1) / o.world);
      std::fflush(stdout);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"gloo_all_reduce: Gloo's ring all-reduce over TCP, float32 sum, in place (one process per rank)"};
  Options o;
  try {
    o.rank = from_environment("RANK");
    o.world = from_environment("WORLD_SIZE");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  app.add_option("--rank", o.rank, "this process's rank (default: $RANK)");
  app.add_option("--world", o.world, "the number of ranks (default: $WORLD_SIZE)");
  app.add_option("--store", o.store, "a folder every rank sees, empty at the start: where the ranks meet")->required();
  app.add_option("--address", o.address, "the address this rank listens on (default: $GLOO_HOSTNAME or 127.0.0.1)");
  app.add_option("--min-bytes", o.min_bytes, "the smallest size, a multiple of 4")->transform(CLI::AsSizeValue(false));
  app.add_option("--max-bytes", o.max_bytes, "the largest size")->transform(CLI::AsSizeValue(false));
  app.add_option("--iters", o.iters, "timed calls per size, at most")->check(CLI::Range(1, 1 << 20));
  app.add_option("--timeout", o.timeout_s, "seconds any wait may take (connecting, each collective)")
      ->check(CLI::Range(1, 86400));
  CLI11_PARSE(app, argc, argv);
  std::string bad;
  if (o.rank < 0 || o.world < 1)
    bad = "no rank or world size: set RANK and WORLD_SIZE (as a launcher does) or give --rank and --world";
  else if (o.rank >= o.world)
    bad = "rank " + std::to_string(o.rank) + " is not below the world size " + std::to_string(o.world);
  else if (o.min_bytes < 4 || o.min_bytes % 4 != 0 || o.max_bytes < o.min_bytes)
    bad = "sizes " + std::to_string(o.min_bytes) + ".." + std::to_string(o.max_bytes) +
          ": the smallest must be a positive multiple of 4 (float32) and not above the largest";
  else if (!std::filesystem::is_directory(o.store))
    bad = "--store " + o.store + " is not a folder; create an empty one that every rank sees";
  if (!bad.empty()) {
    std::fprintf(stderr, "gloo_all_reduce: %s\n", bad.c_str());
    return 2;
  }
  try {
    run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gloo_all_reduce: rank %d: %s\n", o.rank, e.what());
    return 1;
  }
  return 0;
}
