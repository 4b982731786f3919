// The figures of one table row: a size, with its out-of-place and in-place results, as every
// report (the table, nccl-tests' JSON, the CSV) writes them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "bench/perf/iteration_stats.h"

namespace tinyddp::bench {

struct PlacementResult {
  bool ran = false;    // broadcast has no out-of-place run
  double time_us = 0;  // per collective, across ranks as -a says
  double algbw = 0;    // GB/s: size / time
  double busbw = 0;    // GB/s: algbw x the collective's bus factor
  int64_t wrong = -1;  // elements wrong on every rank together; -1: not checked (-c 0)
  // -I 1 only: each iteration's time on the slowest rank, every rank's own times, and their spread.
  bool per_iteration = false;
  std::vector<double> iteration_us;
  std::vector<std::vector<double>> rank_iteration_us;
  int skipped_iterations = 0;  // -K: left out of `stats`, still in the lists
  IterationStats stats;
  SlowestRank slowest;
};

struct ResultRow {
  size_t bytes = 0;   // nccl-tests' "size": the larger of the send and receive buffers
  size_t count = 0;   // the count the collective is called with
  std::string type;   // nccl-tests' type name
  std::string redop;  // "none" for collectives that do not reduce
  int root = -1;      // -1 for collectives without a root
  PlacementResult out_of_place, in_place;
  int iterations = 0;
  std::string finished_at;  // -S 1: "%Y-%m-%d %H:%M:%S"
};

}  // namespace tinyddp::bench
