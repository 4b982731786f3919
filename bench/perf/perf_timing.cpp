#include "bench/perf/perf_timing.h"

#include <chrono>
#include <cstring>

#include "bench/perf/perf_options.h"

namespace tinyddp::bench {

LocalTiming time_placement(comm::ProcessGroup& group, const PerfCollective& collective, const Placement& placement,
                           comm::ReduceOp op, int root, const PerfOptions& options) {
  using Clock = std::chrono::steady_clock;
  auto launch = [&] { return collective.launch(group, placement, op, root); };
  // -z 1: each call returns once its collective is done, as MPI_Allreduce does (CallOptions::blocking).
  comm::CallOptions blocking_call;
  blocking_call.blocking = true;
  // synchronize(), not wait(): on a GPU wait() only orders the caller's stream, and the clock must
  // see the collective end, as nccl-tests' cudaStreamSynchronize does.
  for (int i = 0; i < options.warmup_iters; ++i) launch()->synchronize();
  group.barrier()->synchronize();

  // With -I 1 each iteration is awaited before the next starts, so that its end can be stamped:
  // the caller cannot see inside a queue of collectives launched back to back (they complete on
  // the communication thread while the caller may not even have a core), and stamping them as the
  // caller happens to notice them measures the scheduler. -m N keeps N back to back inside each.
  const size_t per_iteration = size_t(options.agg_iters);
  const bool await_iterations = options.per_iter_timing && !options.blocking;
  std::vector<comm::WorkPtr> works;
  if (!options.blocking) works.reserve(size_t(options.iters) * per_iteration);
  std::vector<Clock::time_point> ends;  // -I 1: when each iteration completed
  // --rewrite 1: the input written from this copy before each call; the copies' time is subtracted.
  Tensor input = placement.input;
  const Tensor original = options.rewrite ? input.clone() : Tensor();
  Clock::duration rewriting{};
  auto rewrite = [&] {
    const auto begin = Clock::now();
    std::memcpy(input.raw_data(), original.raw_data(), original.nbytes());
    rewriting += Clock::now() - begin;
  };
  const auto start = Clock::now();
  for (int i = 0; i < options.iters; ++i) {
    for (size_t a = 0; a < per_iteration; ++a) {
      if (options.rewrite) rewrite();
      if (options.blocking) {
        // Each call awaited and let go, as an MPI-style loop does: keeping every Work would grow the
        // heap by a page every few calls, and the page faults would be timed as the collective's.
        collective.launch(group, placement, op, root, blocking_call)->synchronize();
        continue;
      }
      works.push_back(launch());
    }
    if (await_iterations) works.back()->synchronize();  // in call order: the last done means all done
    if (options.per_iter_timing) ends.push_back(Clock::now() - rewriting);  // each iteration without its rewrite
  }
  // Launched back to back, they run in call order: the last done means all done.
  if (!works.empty()) works.back()->synchronize();
  for (auto& w : works) w->synchronize();  // rethrows the first failure
  const auto end = Clock::now() - rewriting;

  LocalTiming t;
  t.seconds = std::chrono::duration<double>(end - start).count() / double(size_t(options.iters) * per_iteration);
  auto before = start;
  for (auto at : ends) {
    t.iteration_seconds.push_back(std::chrono::duration<double>(at - before).count() / double(per_iteration));
    before = at;
  }
  return t;
}

}  // namespace tinyddp::bench
