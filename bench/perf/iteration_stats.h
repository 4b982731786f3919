// IterationStats: the spread of per-iteration times, as nccl-tests' -I 1 reports it (its
// computeIterStats): min, max, mean, p50/p95/p99 by the nearest-rank rule (so with fewer than 100
// samples p99 may equal max), the population standard deviation and the coefficient of variation.
#pragma once

#include <vector>

namespace tinyddp::bench {

struct IterationStats {
  double min = 0, max = 0, avg = 0, p50 = 0, p95 = 0, p99 = 0, stdev = 0;
  double cv_pct() const { return avg > 0 ? stdev / avg * 100.0 : 0.0; }
};

// Stats of `times` (any unit; at least one sample).
IterationStats iteration_stats(std::vector<double> times);

// Which of several ranks was slowest: the one whose mean per-iteration time is the largest, and by
// how much its mean exceeds the fastest rank's, in percent. `per_rank[r]` holds rank r's times.
struct SlowestRank {
  int rank = -1;
  double mean = 0;
  double spread_pct = 0;
};
SlowestRank slowest_rank(const std::vector<std::vector<double>>& per_rank);

}  // namespace tinyddp::bench
