// Timing one placement of one row: warm-up, then -n iterations of -m collectives each, launched
// back to back (-z 0: the communication thread runs them in order, as a GPU stream runs nccl-tests'
// launches) or each awaited before the next (-z 1: the latency a synchronous caller sees). With
// -I 1 every iteration is awaited before the next, and timed alone.
#pragma once

#include <vector>

#include "bench/perf/perf_collective.h"

namespace tinyddp::bench {

struct PerfOptions;

struct LocalTiming {
  double seconds = 0;                     // this rank's mean time per collective
  std::vector<double> iteration_seconds;  // -I 1: each iteration's time (per collective of it)
};

// Times `placement` on this rank; every rank calls it together.
LocalTiming time_placement(comm::ProcessGroup& group, const PerfCollective& collective, const Placement& placement,
                           comm::ReduceOp op, int root, const PerfOptions& options);

}  // namespace tinyddp::bench
