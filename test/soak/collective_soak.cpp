// collective_soak: every collective of the host backend, over and over, for a given time, each
// result checked against the value it must have exactly.
//
//   tinyddp-run -n 4 build/bin/collective_soak --seconds 600                  (shm and tcp, mixed)
//   tinyddp-run -n 4 build/bin/collective_soak --seconds 300 --transports tcp
//
// Each rank opens one process group per transport named in --transports, and then every rank draws
// the same schedule from the same seed: which group, which collective (all_reduce in and out of
// place with sum, avg, max, min and prod; broadcast from a rotating root; all_gather; reduce_scatter
// with sum and max; barrier), which dtype (f32, f64, i32, i64) and how many elements (0 to
// --max-bytes), and how many collectives to launch before waiting for them (1 to 4: the queue is
// exercised too). Inputs are small integers from a hash of (collective, rank, element), so the exact
// result is known in every dtype (avg inputs are multiples of the world size: the average is an
// integer): every element is compared with ==.
//
// Every wait is bounded: a collective runs under --timeout-ms (the group's own timeout ends it with
// an error), and this program gives up waiting for it 10 s after that ("hang"). A failure of either
// kind ends the run at once with exit status 1 (the group is aborted after a failure anyway); wrong
// elements are counted and the run goes on, then exits 1. Rank 0 decides when time is up, and says
// so to the others through a small all_reduce every 8 batches, so every rank stops at the same
// collective. At the end, rank 0 prints the totals over all ranks; a collective's time runs from its
// launch to the end of its wait (in a batch, the later ones include their wait behind the earlier).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tinyddp/comm/process_group.h"
#include "tinyddp/comm/store/hash_store.h"
#include "tinyddp/comm/store/rendezvous.h"
#include "tinyddp/core/command_line.h"
#include "tinyddp/core/error.h"
#include "tinyddp/core/tensor.h"

using namespace tinyddp;
using namespace tinyddp::comm;

namespace {

using Clock = std::chrono::steady_clock;

enum class Kind { all_reduce, all_reduce_into, broadcast, all_gather, reduce_scatter, barrier };
const char* kind_name(Kind k) {
  switch (k) {
    case Kind::all_reduce: return "all_reduce";
    case Kind::all_reduce_into: return "all_reduce_into";
    case Kind::broadcast: return "broadcast";
    case Kind::all_gather: return "all_gather";
    case Kind::reduce_scatter: return "reduce_scatter";
    case Kind::barrier: return "barrier";
  }
  return "?";
}

// One collective of the schedule: identical on every rank (drawn from the shared seed).
struct Plan {
  uint64_t id = 0;  // its number in the schedule; salts the inputs
  int group = 0;    // index into the transports
  Kind kind = Kind::barrier;
  DType dtype = DType::f32;
  ReduceOp op = ReduceOp::sum;
  int64_t count = 0;  // elements per rank (all_gather: of the input; reduce_scatter: of the output)
  int root = 0;       // broadcast
};

// "reduce_scatter f64[106400] sum", "broadcast i32[17] from 2", "barrier".
std::string describe(const Plan& plan) {
  std::string text = kind_name(plan.kind);
  if (plan.kind == Kind::barrier) return text;
  text += std::string(" ") + dtype_name(plan.dtype) + "[" + std::to_string(plan.count) + "]";
  if (plan.kind == Kind::broadcast) return text + " from " + std::to_string(plan.root);
  if (plan.kind == Kind::all_gather) return text;
  return text + " " + reduce_op_name(plan.op);
}

// The input element `i` of `rank` for collective `plan`: a small integer, exact in every dtype.
int64_t input_value(const Plan& plan, int rank, int64_t i, int world) {
  uint64_t h = plan.id * 0x9E3779B97F4A7C15ull ^ uint64_t(rank) * 0xC2B2AE3D27D4EB4Full ^
               uint64_t(i) * 0x165667B19E3779F9ull;
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 32;
  switch (plan.op) {
    case ReduceOp::sum: return int64_t(h % 7) - 3;            // [-3, 3]
    case ReduceOp::avg: return world * (int64_t(h % 7) - 3);  // the average is the integer sum of h % 7 - 3
    case ReduceOp::max:
    case ReduceOp::min: return int64_t(h % 101) - 50;                     // [-50, 50]
    case ReduceOp::prod: return std::array<int64_t, 3>{-1, 1, 2}[h % 3];  // |product| <= 2^world
  }
  return 0;
}

// op over every rank's input element i (ranks `first`..: for reduce_scatter, element i of the block).
int64_t reduced_value(const Plan& plan, int64_t i, int world) {
  int64_t acc = input_value(plan, 0, i, world);
  for (int r = 1; r < world; ++r) {
    int64_t v = input_value(plan, r, i, world);
    switch (plan.op) {
      case ReduceOp::sum:
      case ReduceOp::avg: acc += v; break;
      case ReduceOp::max: acc = std::max(acc, v); break;
      case ReduceOp::min: acc = std::min(acc, v); break;
      case ReduceOp::prod: acc *= v; break;
    }
  }
  return plan.op == ReduceOp::avg ? acc / world : acc;  // exact: every input is a multiple of world
}

template <typename T>
void fill(Tensor& t, const Plan& plan, int rank, int world, int64_t first_index = 0) {
  T* p = t.data<T>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = T(input_value(plan, rank, first_index + i, world));
}

// Elements of `got` that differ from expected(i); prints the first few of them.
template <typename T, typename Expected>
int64_t count_wrong(const Tensor& got, const Plan& plan, int rank, Expected expected) {
  const T* p = got.data<T>();
  int64_t wrong = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    T want = T(expected(i));
    if (p[i] == want) continue;
    if (++wrong <= 3)
      std::fprintf(stderr,
                   "collective_soak: rank %d: %s (#%" PRIu64 " of the schedule): element %" PRId64
                   " is %g, expected %g\n",
                   rank, describe(plan).c_str(), plan.id, i, double(p[i]), double(want));
  }
  return wrong;
}

// A launched collective and what its result is checked against.
struct InFlight {
  Plan plan;
  WorkPtr work;
  Tensor input, output;
  Clock::time_point launched;
};

template <typename T>
InFlight launch_typed(ProcessGroup& pg, const Plan& plan, const CallOptions& call) {
  const int rank = pg.rank(), world = pg.size();
  InFlight f{plan, nullptr, {}, {}, Clock::now()};
  switch (plan.kind) {
    case Kind::all_reduce:
      f.output = Tensor::empty({plan.count}, plan.dtype);
      fill<T>(f.output, plan, rank, world);
      f.launched = Clock::now();
      f.work = pg.all_reduce(f.output, plan.op, call);
      break;
    case Kind::all_reduce_into:
      f.input = Tensor::empty({plan.count}, plan.dtype);
      f.output = Tensor::empty({plan.count}, plan.dtype);
      fill<T>(f.input, plan, rank, world);
      f.launched = Clock::now();
      f.work = pg.all_reduce_into(f.output, f.input, plan.op, call);
      break;
    case Kind::broadcast:
      f.output = Tensor::empty({plan.count}, plan.dtype);
      fill<T>(f.output, plan, rank, world);
      f.launched = Clock::now();
      f.work = pg.broadcast(f.output, plan.root, call);
      break;
    case Kind::all_gather:
      f.input = Tensor::empty({plan.count}, plan.dtype);
      f.output = Tensor::empty({plan.count * world}, plan.dtype);
      fill<T>(f.input, plan, rank, world);
      f.launched = Clock::now();
      f.work = pg.all_gather(f.output, f.input, call);
      break;
    case Kind::reduce_scatter:
      f.input = Tensor::empty({plan.count * world}, plan.dtype);
      f.output = Tensor::empty({plan.count}, plan.dtype);
      fill<T>(f.input, plan, rank, world);
      f.launched = Clock::now();
      f.work = pg.reduce_scatter(f.output, f.input, plan.op, call);
      break;
    case Kind::barrier: f.work = pg.barrier(call); break;
  }
  return f;
}

template <typename T>
int64_t check_typed(const InFlight& f, int rank, int world) {
  const Plan& plan = f.plan;
  switch (plan.kind) {
    case Kind::all_reduce:
    case Kind::all_reduce_into:
      if (plan.kind == Kind::all_reduce_into &&  // the input must be left as it was
          count_wrong<T>(f.input, plan, rank, [&](int64_t i) { return input_value(plan, rank, i, world); }) > 0)
        return 1 + count_wrong<T>(f.output, plan, rank, [&](int64_t i) { return reduced_value(plan, i, world); });
      return count_wrong<T>(f.output, plan, rank, [&](int64_t i) { return reduced_value(plan, i, world); });
    case Kind::broadcast:
      return count_wrong<T>(f.output, plan, rank, [&](int64_t i) { return input_value(plan, plan.root, i, world); });
    case Kind::all_gather:
      return count_wrong<T>(f.output, plan, rank,
                            [&](int64_t i) { return input_value(plan, int(i / plan.count), i % plan.count, world); });
    case Kind::reduce_scatter:
      // The input's element j is the hash of j, so this rank's block of the reduction starts at rank * count.
      return count_wrong<T>(f.output, plan, rank,
                            [&](int64_t i) { return reduced_value(plan, rank * plan.count + i, world); });
    case Kind::barrier: return 0;
  }
  return 0;
}

InFlight launch(ProcessGroup& pg, const Plan& plan, const CallOptions& call) {
  switch (plan.dtype) {
    case DType::f32: return launch_typed<float>(pg, plan, call);
    case DType::f64: return launch_typed<double>(pg, plan, call);
    case DType::i32: return launch_typed<int32_t>(pg, plan, call);
    default: return launch_typed<int64_t>(pg, plan, call);
  }
}

int64_t check(const InFlight& f, int rank, int world) {
  switch (f.plan.dtype) {
    case DType::f32: return check_typed<float>(f, rank, world);
    case DType::f64: return check_typed<double>(f, rank, world);
    case DType::i32: return check_typed<int32_t>(f, rank, world);
    default: return check_typed<int64_t>(f, rank, world);
  }
}

// The payload of one collective on one rank, in bytes: the buffer the collective fills.
uint64_t payload_bytes(const InFlight& f) { return f.output.defined() ? f.output.nbytes() : 0; }

// Draws the next collective. Sizes: 10% empty, 20% 1-16 elements, 30% up to 1 Ki, 25% up to 64 Ki,
// 15% up to max_bytes; log-uniform inside each band, so every size class is visited often.
Plan draw(std::mt19937_64& rng, uint64_t id, int groups, int world, size_t max_bytes) {
  Plan p;
  p.id = id;
  p.group = int(rng() % uint64_t(groups));
  static constexpr Kind kinds[] = {Kind::all_reduce, Kind::all_reduce,     Kind::all_reduce_into, Kind::broadcast,
                                   Kind::all_gather, Kind::reduce_scatter, Kind::barrier};
  p.kind = kinds[rng() % std::size(kinds)];
  static constexpr DType dtypes[] = {DType::f32, DType::f64, DType::i32, DType::i64};
  p.dtype = dtypes[rng() % std::size(dtypes)];
  static constexpr ReduceOp ops[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min, ReduceOp::prod};
  p.op = p.kind == Kind::reduce_scatter ? (rng() % 2 ? ReduceOp::sum : ReduceOp::max) : ops[rng() % std::size(ops)];
  p.root = int(rng() % uint64_t(world));
  const int64_t elem = int64_t(dtype_size(p.dtype));
  // all_gather and reduce_scatter hold world times the per-rank count: keep that under max_bytes too.
  const int64_t most = std::max<int64_t>(1, int64_t(max_bytes) / elem /
                                                (p.kind == Kind::all_gather || p.kind == Kind::reduce_scatter ? world
                                                                                                              : 1));
  const uint64_t band = rng() % 100;
  auto log_uniform = [&](int64_t lo, int64_t hi) {
    hi = std::max(lo, std::min(hi, most));
    double x = std::uniform_real_distribution<double>(std::log(double(lo)), std::log(double(hi) + 1))(rng);
    return std::clamp<int64_t>(int64_t(std::exp(x)), lo, hi);
  };
  if (band < 10)
    p.count = 0;
  else if (band < 30)
    p.count = log_uniform(1, 16);
  else if (band < 60)
    p.count = log_uniform(17, 1024);
  else if (band < 85)
    p.count = log_uniform(1025, 64 * 1024);
  else
    p.count = log_uniform(64 * 1024 + 1, most);
  if (p.kind == Kind::barrier) p.count = 0;
  return p;
}

struct Totals {
  int64_t collectives = 0, bytes = 0, wrong = 0;
  int64_t slowest_us = 0;
  std::string slowest;  // what it was
};

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  char text[32];
  std::snprintf(text, sizeof text, "%.1f %s", b, units[u]);
  return text;
}

std::vector<std::string> split(const std::string& list) {
  std::vector<std::string> parts;
  std::stringstream in(list);
  for (std::string part; std::getline(in, part, ',');)
    if (!part.empty()) parts.push_back(part);
  return parts;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "collective_soak: every collective of the host backend, checked exactly, for a given time (run it under "
      "tinyddp-run)"};
  double seconds = 10;
  std::string transports_text = "shm,tcp", max_text;
  size_t max_bytes = 4 << 20;
  uint64_t seed = 1;
  int timeout_ms = 60000, report_every = 60, max_in_flight = 4;
  app.add_option("--seconds", seconds, "how long to run (rank 0's clock)");
  app.add_option("--transports", transports_text,
                 "comma-separated ring transports, one process group each: shm, tcp, auto");
  app.add_option("--max-bytes", max_bytes, "the largest buffer a collective fills on one rank");
  app.add_option("--seed", seed, "the schedule's seed (every rank draws the same)");
  app.add_option("--timeout-ms", timeout_ms, "every collective's timeout; waits give up 10 s after it");
  app.add_option("--max-in-flight", max_in_flight, "launch 1 to this many collectives before waiting for them");
  app.add_option("--report-every", report_every, "seconds between rank 0's progress lines (0: none)");
  if (auto code = tinyddp::command_line::parse(app, argc, argv)) return *code;

  try {
    const std::vector<std::string> transports = split(transports_text);
    TINYDDP_CHECK(!transports.empty() && seconds >= 0 && timeout_ms > 0 && max_bytes > 0 && max_in_flight > 0,
                  "collective_soak: need --transports (e.g. shm,tcp), --seconds >= 0, --timeout-ms > 0, --max-bytes > "
                  "0 and --max-in-flight > 0");
    TINYDDP_CHECK(read_launch_environment().rank >= 0,
                  "collective_soak: no launcher environment (RANK, WORLD_SIZE, ...)",
                  hint("run it as `tinyddp-run -n 4 collective_soak ...`"));
    Rendezvous rv = rendezvous("env://");
    const int rank = rv.rank, world = rv.world_size;
    std::vector<std::shared_ptr<ProcessGroup>> groups;
    for (const std::string& transport : transports) {
      ProcessGroupOptions options;
      options.transport = transport;
      options.group_name = "soak-" + transport;
      options.timeout = std::chrono::milliseconds(timeout_ms);
      groups.push_back(create_process_group("host", rv.store, rank, world, options));
    }
    if (rank == 0)
      std::printf("collective_soak: %d ranks, transports %s, %.0f s, max %s a buffer, seed %" PRIu64 "\n", world,
                  transports_text.c_str(), seconds, human_bytes(double(max_bytes)).c_str(), seed);

    const CallOptions call{std::chrono::milliseconds(timeout_ms)};
    const auto give_up_after = std::chrono::milliseconds(timeout_ms) + std::chrono::seconds(10);
    std::vector<Totals> per_group(groups.size());
    std::mt19937_64 rng(seed);
    const auto start = Clock::now();
    auto next_report = start + std::chrono::seconds(report_every);
    uint64_t id = 0;

    // Waits for one collective, bounded; checks (unless told not to) and counts it. A failure or a
    // hang ends the run.
    auto finish = [&](InFlight& f, bool checked) {
      bool done = false;
      try {
        done = f.work->wait_for(std::chrono::duration_cast<Work::Duration>(give_up_after));
      } catch (const std::exception& e) {
        std::fprintf(stderr, "collective_soak: rank %d: %s (#%" PRIu64 " of the schedule) over %s failed: %s\n", rank,
                     describe(f.plan).c_str(), f.plan.id, transports[f.plan.group].c_str(), e.what());
        std::fflush(nullptr);
        std::_Exit(1);  // the group is aborted; its threads may still be unwinding
      }
      if (!done) {
        std::fprintf(stderr,
                     "collective_soak: rank %d: HANG: %s (#%" PRIu64
                     " of the schedule) over %s not done %lld s"
                     " after this rank began to wait for it, though its timeout is %d ms\n",
                     rank, describe(f.plan).c_str(), f.plan.id, transports[f.plan.group].c_str(),
                     (long long)std::chrono::duration_cast<std::chrono::seconds>(give_up_after).count(), timeout_ms);
        std::fflush(nullptr);
        std::_Exit(1);
      }
      auto us = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - f.launched).count();
      Totals& t = per_group[f.plan.group];
      ++t.collectives;
      t.bytes += int64_t(payload_bytes(f));
      if (checked) t.wrong += check(f, rank, world);
      if (us > t.slowest_us) {
        t.slowest_us = us;
        t.slowest = describe(f.plan);
      }
    };

    for (uint64_t batch = 0;; ++batch) {
      // Every 8 batches rank 0 says whether time is up (max over ranks of its flag: only rank 0 sets it).
      if (batch % 8 == 0) {
        Tensor stop = Tensor::zeros({1}, DType::i32);
        if (rank == 0 && Clock::now() - start >= std::chrono::duration<double>(seconds)) stop.data<int32_t>()[0] = 1;
        InFlight f{Plan{}, groups[0]->all_reduce(stop, ReduceOp::max, call), {}, stop, Clock::now()};
        f.plan = {~uint64_t(0), 0, Kind::all_reduce, DType::i32, ReduceOp::max, 1, 0};
        finish(f, /*checked=*/false);  // its value is the answer, not a hash: only bounded, timed and counted
        if (stop.data<int32_t>()[0] != 0) break;
      }
      const int depth = 1 + int(rng() % uint64_t(max_in_flight));
      std::vector<InFlight> flying;
      for (int k = 0; k < depth; ++k) {
        Plan plan = draw(rng, id++, int(groups.size()), world, max_bytes);
        flying.push_back(launch(*groups[plan.group], plan, call));
      }
      for (InFlight& f : flying) finish(f, /*checked=*/true);
      if (rank == 0 && report_every > 0 && Clock::now() >= next_report) {
        next_report += std::chrono::seconds(report_every);
        int64_t n = 0, wrong = 0;
        for (const Totals& t : per_group) n += t.collectives, wrong += t.wrong;
        std::printf("collective_soak: %4.0f s: rank 0 ran %" PRId64 " collectives, %" PRId64 " wrong elements\n",
                    std::chrono::duration<double>(Clock::now() - start).count(), n, wrong);
        std::fflush(stdout);
      }
    }
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();

    // Totals over every rank, through the first group: sums, and the slowest collective's time.
    const int g = int(groups.size());
    Tensor sums = Tensor::zeros({3 * g}, DType::i64), slowest = Tensor::zeros({g}, DType::i64);
    for (int i = 0; i < g; ++i) {
      sums.data<int64_t>()[3 * i] = per_group[i].collectives;
      sums.data<int64_t>()[3 * i + 1] = per_group[i].bytes;
      sums.data<int64_t>()[3 * i + 2] = per_group[i].wrong;
      slowest.data<int64_t>()[i] = per_group[i].slowest_us;
    }
    TINYDDP_CHECK(groups[0]->all_reduce(sums, ReduceOp::sum, call)->wait_for(give_up_after) &&
                      groups[0]->all_reduce(slowest, ReduceOp::max, call)->wait_for(give_up_after),
                  "collective_soak: the final totals did not arrive within ", give_up_after.count(), " ms");
    int64_t wrong_all = 0;
    for (int i = 0; i < g; ++i) wrong_all += sums.data<int64_t>()[3 * i + 2];
    if (rank == 0) {
      int64_t n_all = 0, bytes_all = 0, slowest_all = 0;
      std::printf("collective_soak: %.1f s, %d ranks\n", elapsed, world);
      for (int i = 0; i < g; ++i) {
        const int64_t n = sums.data<int64_t>()[3 * i], bytes = sums.data<int64_t>()[3 * i + 1];
        n_all += n;
        bytes_all += bytes;
        slowest_all = std::max(slowest_all, slowest.data<int64_t>()[i]);
        std::printf("  over %-4s %10" PRId64 " collectives (all ranks), %10s, wrong elements %" PRId64
                    ", slowest %.1f ms (rank 0's slowest: %s, %.1f ms)\n",
                    transports[i].c_str(), n, human_bytes(double(bytes)).c_str(), sums.data<int64_t>()[3 * i + 2],
                    double(slowest.data<int64_t>()[i]) / 1000, per_group[i].slowest.c_str(),
                    double(per_group[i].slowest_us) / 1000);
      }
      std::printf("collectives run      %" PRId64 " (%" PRId64 " a rank)\n", n_all, n_all / world);
      std::printf("bytes                %s (the buffers the collectives filled, all ranks)\n",
                  human_bytes(double(bytes_all)).c_str());
      std::printf("wrong results        %" PRId64 " elements\n", wrong_all);
      std::printf("hangs/timeouts       0\n");  // either ends the run at once, before this line
      std::printf("slowest collective   %.1f ms\n", double(slowest_all) / 1000);
      std::fflush(stdout);
    }
    return wrong_all == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "collective_soak: %s\n", e.what());
    return 1;
  }
}
