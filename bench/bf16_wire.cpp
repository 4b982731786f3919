// bf16_wire: what sending gradients as bf16 does to the error and to the time of an all-reduce.
//
//   bf16_wire --mode error [--count N] [--seed S]
//       In one process, ranks on threads over shared memory, world sizes 2, 4 and 8: the same
//       gradient-like f32 data summed by the f32 ring, the bf16 ring (one rounding per hop) and the
//       single-rounding bf16 all-reduce (all_reduce_single_rounding), each compared with the sum in
//       f64. Prints a Markdown table (docs/bf16-on-the-wire.md shows it).
//
//   tinyddp-run -n 2 bf16_wire --mode time [--mib 16] [--rounds 10] [--transport tcp]
//       Under a launcher: the all-reduce of MIB MiB of f32 gradients, against the same gradients sent
//       as bf16 (converted, all-reduced, converted back: what a compression hook does), the bf16
//       all-reduce alone, and the single-rounding one. The variants alternate within every round,
//       so a machine that slows down slows them all. Rank 0 prints min / median / max of each and the
//       ratio of the medians to f32's. Each time is the slowest rank's, after a barrier.
//
//   tinyddp-run -n 2 bf16_wire --mode hooks [--mib 16] [--rounds 10] [--transport tcp]
//       As time, but each variant is one of DDP's built-in comm hooks (nn/ddp/comm_hook.h) run on one
//       bucket of MIB MiB: allreduce (f32), fp16_compress, bf16_compress, bf16_single_rounding, from
//       the call to the end of the future's wait (the bucket refilled with the gradients before each).
//       bench/peers/torch_comm_hook.py does the same with PyTorch's hooks.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tinyddp/comm/process_group.h"
#include "tinyddp/comm/store/hash_store.h"
#include "tinyddp/core/command_line.h"
#include "tinyddp/core/half_precision.h"
#include "tinyddp/core/tensor.h"
#include "tinyddp/kernels/ops.h"
#include "tinyddp/nn/ddp/comm_hook.h"

using namespace tinyddp;
using namespace tinyddp::comm;
using Clock = std::chrono::steady_clock;

namespace {

// Rank r's gradients: a signal every rank shares plus noise of its own (ranks see different batches of
// one model), magnitudes spread over three decades as a layer's gradients are.
std::vector<float> gradients(size_t count, int rank, uint64_t seed) {
  std::mt19937_64 shared_rng(seed), own_rng(seed * 1000003 + uint64_t(rank) + 1);
  // One distribution per generator: a normal distribution keeps the second value of each pair it draws.
  std::normal_distribution<float> shared_normal(0.f, 1.f), own_normal(0.f, 1.f);
  std::uniform_real_distribution<float> decade(-3.f, 0.f);
  std::vector<float> g(count);
  for (size_t i = 0; i < count; ++i) {
    const float scale = std::pow(10.f, decade(shared_rng)), signal = shared_normal(shared_rng);
    g[i] = scale * (signal + own_normal(own_rng));
  }
  return g;
}

// ---- --mode error ---------------------------------------------------------------------------------

struct ErrorStats {
  double mean_relative = 0, max_relative = 0, normwise = 0;
};

// Relative errors over the elements whose exact sum is at least 1% of the sums' RMS (where the sum
// cancels to nearly zero a relative error says nothing), and the normwise ||got - exact|| / ||exact||.
ErrorStats compare(const std::vector<float>& got, const std::vector<double>& exact) {
  double sum_sq = 0, diff_sq = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    sum_sq += exact[i] * exact[i];
    diff_sq += (double(got[i]) - exact[i]) * (double(got[i]) - exact[i]);
  }
  const double floor = 0.01 * std::sqrt(sum_sq / double(got.size()));
  ErrorStats s;
  size_t counted = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::fabs(exact[i]) < floor) continue;
    const double e = std::fabs(double(got[i]) - exact[i]) / std::fabs(exact[i]);
    s.mean_relative += e;
    s.max_relative = std::max(s.max_relative, e);
    ++counted;
  }
  s.mean_relative /= double(std::max<size_t>(counted, 1));
  s.normwise = std::sqrt(diff_sq / sum_sq);
  return s;
}

// Runs body(rank, group) on `world` threads, one host process group each (shared memory, the ring).
void with_groups(int world, const std::function<void(int, ProcessGroup&)>& body) {
  auto store = std::make_shared<HashStore>();
  ProcessGroupOptions options;
  options.transport = "shm";
  options.algorithm = "ring";
  options.group_name = "bf16-error-" + std::to_string(world);
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        auto group = create_process_group("host", store, r, world, options);
        body(r, *group);
        group->barrier()->wait();
      } catch (...) {
        errors[size_t(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

void print_row(int world, const char* method, const ErrorStats& vs_inputs, const ErrorStats& vs_f32) {
  std::printf("| %d | %s | %.3g | %.3g | %.3g | %.3g | %.3g |\n", world, method, vs_inputs.mean_relative,
              vs_inputs.max_relative, vs_inputs.normwise, vs_f32.mean_relative, vs_f32.normwise);
}

void measure_error(size_t count, uint64_t seed) {
  std::printf(
      "| world | all-reduce | mean rel. error (sum) | max rel. error (sum) | normwise (sum) | "
      "mean rel. error (incl. f32->bf16) | normwise (incl. f32->bf16) |\n|---|---|---|---|---|---|---|\n");
  for (int world : {2, 4, 8}) {
    std::vector<std::vector<float>> g(static_cast<size_t>(world));
    for (int r = 0; r < world; ++r) g[size_t(r)] = gradients(count, r, seed);
    // Two exact sums in f64: of the f32 gradients, and of their bf16 roundings (what the bf16
    // collectives are given), so the error of the sum itself shows apart from the input rounding.
    std::vector<double> exact_f32(count, 0.0), exact_bf16(count, 0.0);
    for (int r = 0; r < world; ++r)
      for (size_t i = 0; i < count; ++i) {
        exact_f32[i] += double(g[size_t(r)][i]);
        exact_bf16[i] += double(float(bfloat16(g[size_t(r)][i])));
      }
    std::vector<float> f32_ring, bf16_ring, bf16_single;
    with_groups(world, [&](int r, ProcessGroup& pg) {
      Tensor f = Tensor::from_vector(g[size_t(r)], {int64_t(count)});
      Tensor b = f.to(DType::bf16), b1 = f.to(DType::bf16);
      pg.all_reduce(f)->wait();
      pg.all_reduce(b)->wait();
      pg.all_reduce_single_rounding(b1)->wait();
      if (r == 0) {
        f32_ring = f.to_vector<float>();
        bf16_ring = b.to(DType::f32).to_vector<float>();
        bf16_single = b1.to(DType::f32).to_vector<float>();
      }
    });
    print_row(world, "f32 ring", compare(f32_ring, exact_f32), compare(f32_ring, exact_f32));
    print_row(world, "bf16 ring", compare(bf16_ring, exact_bf16), compare(bf16_ring, exact_f32));
    print_row(world, "bf16 single rounding", compare(bf16_single, exact_bf16), compare(bf16_single, exact_f32));
  }
}

// ---- --mode time ------------------------------------------------------------------------------------

struct Variant {
  const char* name;
  std::function<void()> run;
  std::vector<double> seconds;
  std::function<void()> prepare = {};  // before the barrier, not timed
};

// Runs the variants in turns, a different one first in each round, and records the slowest rank's
// time of each after `warmup` rounds.
void run_rounds(ProcessGroup& pg, std::vector<Variant>& variants, int rounds, int warmup) {
  Tensor slowest = Tensor::empty({1}, DType::f64);
  for (int round = 0; round < warmup + rounds; ++round) {
    for (size_t k = 0; k < variants.size(); ++k) {
      Variant& v = variants[(k + size_t(round)) % variants.size()];
      if (v.prepare) v.prepare();
      pg.barrier()->wait();
      const auto start = Clock::now();
      v.run();
      slowest.data<double>()[0] = std::chrono::duration<double>(Clock::now() - start).count();
      pg.all_reduce(slowest, ReduceOp::max)->wait();
      if (round >= warmup) v.seconds.push_back(slowest.data<double>()[0]);
    }
  }
}

// Rank 0 prints min / median / max of each variant and its median over the first one's.
void print_times(const ProcessGroup& pg, std::vector<Variant>& variants, const std::string& transport, double mib,
                 int64_t count, int rounds, int warmup) {
  if (pg.rank() != 0) return;
  auto median = [](std::vector<double> s) {
    std::sort(s.begin(), s.end());
    return s[s.size() / 2];
  };
  const double base = median(variants[0].seconds);
  std::printf("%d ranks, transport %s, %.1f MiB of f32 (%lld elements), %d rounds after %d warm-up\n", pg.size(),
              transport.c_str(), mib, static_cast<long long>(count), rounds, warmup);
  std::printf("| variant | min ms | median ms | max ms | median / f32 |\n|---|---|---|---|---|\n");
  for (Variant& v : variants) {
    const auto [lo, hi] = std::minmax_element(v.seconds.begin(), v.seconds.end());
    std::printf("| %s | %.1f | %.1f | %.1f | %.2f |\n", v.name, *lo * 1e3, median(v.seconds) * 1e3, *hi * 1e3,
                median(v.seconds) / base);
  }
}

// The host process group of the launched job (tinyddp-run's environment), on `transport`.
std::shared_ptr<ProcessGroup> join_ring(const std::string& transport) {
  ProcessGroupOptions options;
  options.transport = transport;
  return init_process_group("host", "env://", -1, -1, options);
}

void measure_time(double mib, int rounds, int warmup, const std::string& transport) {
  auto pg = join_ring(transport);
  const int64_t count = int64_t(mib * double(1 << 20) / 4);
  Tensor grad = Tensor::from_vector(gradients(size_t(count), pg->rank(), 7), {count});
  Tensor f32 = grad.clone(), wire = Tensor::empty({count}, DType::bf16), back = Tensor::empty({count});
  std::vector<Variant> variants = {
      {"f32 all_reduce", [&] { pg->all_reduce(f32)->wait(); }, {}},
      {"bf16 hook (convert, all_reduce, convert back)",
       [&] {
         kernels::convert(grad, wire);
         pg->all_reduce(wire)->wait();
         kernels::convert(wire, back);
       },
       {}},
      {"bf16 all_reduce alone", [&] { pg->all_reduce(wire)->wait(); }, {}},
      {"bf16 single rounding (convert, all_reduce_single_rounding, convert back)",
       [&] {
         kernels::convert(grad, wire);
         pg->all_reduce_single_rounding(wire)->wait();
         kernels::convert(wire, back);
       },
       {}},
  };
  run_rounds(*pg, variants, rounds, warmup);
  print_times(*pg, variants, transport, mib, count, rounds, warmup);
}

// The built-in comm hooks themselves, each on one bucket holding this rank's gradients.
void measure_hooks(double mib, int rounds, int warmup, const std::string& transport) {
  auto pg = join_ring(transport);
  const int64_t count = int64_t(mib * double(1 << 20) / 4);
  Tensor grad = Tensor::from_vector(gradients(size_t(count), pg->rank(), 7), {count});
  nn::GradBucket bucket;
  bucket.buffer = grad.clone();
  bucket.last = true;
  std::vector<Variant> variants;
  for (const char* name : {"allreduce", "fp16_compress", "bf16_compress", "bf16_single_rounding"}) {
    nn::CommHook hook = nn::comm_hooks::by_name(name);
    variants.push_back({name,
                        [&pg, &bucket, hook] { hook(*pg, bucket).wait(); },
                        {},
                        [&bucket, &grad] { bucket.buffer.copy_from(grad); }});
  }
  run_rounds(*pg, variants, rounds, warmup);
  print_times(*pg, variants, transport, mib, count, rounds, warmup);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bf16_wire: error and time of bf16 all-reduces beside f32 (see docs/bf16-on-the-wire.md)"};
  std::string mode = "error", transport = "tcp";
  size_t count = 1 << 20;
  uint64_t seed = 1;
  double mib = 16;
  int rounds = 10, warmup = 2;
  app.add_option("--mode", mode, "error (in one process, world sizes 2, 4, 8), time or hooks (under tinyddp-run)")
      ->check(CLI::IsMember({"error", "time", "hooks"}))
      ->capture_default_str();
  app.add_option("--count", count, "error: elements per rank")
      ->check(command_line::at_least<size_t>(1))
      ->capture_default_str();
  app.add_option("--seed", seed, "error: the gradients' seed")->capture_default_str();
  app.add_option("--mib", mib, "time, hooks: MiB of f32 gradients per rank")
      ->check(command_line::positive<double>())
      ->capture_default_str();
  app.add_option("--rounds", rounds, "time, hooks: measured rounds")
      ->check(command_line::at_least(1))
      ->capture_default_str();
  app.add_option("--warmup", warmup, "time, hooks: rounds before measuring")
      ->check(command_line::at_least(0))
      ->capture_default_str();
  app.add_option("--transport", transport, "time, hooks: the ring's transport")
      ->check(CLI::IsMember({"tcp", "shm", "auto"}))
      ->capture_default_str();
  if (auto code = command_line::parse(app, argc, argv)) return *code;
  try {
    if (mode == "error")
      measure_error(count, seed);
    else if (mode == "time")
      measure_time(mib, rounds, warmup, transport);
    else
      measure_hooks(mib, rounds, warmup, transport);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bf16_wire: %s\n", e.what());
    return command_line::kFailed;
  }
  return 0;
}
