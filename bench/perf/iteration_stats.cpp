#include "bench/perf/iteration_stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace tinyddp::bench {

namespace {
// The nearest-rank percentile's index in n sorted samples: ceil(n * p / 100) - 1.
size_t percentile_index(size_t n, int percentile) { return std::min(n - 1, (n * size_t(percentile) + 99) / 100 - 1); }
double mean(const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0) / double(v.size()); }
}  // namespace

IterationStats iteration_stats(std::vector<double> times) {
  IterationStats s;
  if (times.empty()) return s;
  std::sort(times.begin(), times.end());
  const size_t n = times.size();
  s.min = times.front();
  s.max = times.back();
  s.p50 = times[n / 2];
  s.p95 = times[percentile_index(n, 95)];
  s.p99 = times[percentile_index(n, 99)];
  s.avg = mean(times);
  double var = 0;
  for (double t : times) var += (t - s.avg) * (t - s.avg);
  s.stdev = std::sqrt(var / double(n));
  return s;
}

SlowestRank slowest_rank(const std::vector<std::vector<double>>& per_rank) {
  SlowestRank slowest;
  double fastest = -1;
  for (size_t r = 0; r < per_rank.size(); ++r) {
    if (per_rank[r].empty()) continue;
    double m = mean(per_rank[r]);
    if (slowest.rank < 0 || m > slowest.mean) slowest = {int(r), m, 0};
    if (fastest < 0 || m < fastest) fastest = m;
  }
  if (fastest > 0) slowest.spread_pct = (slowest.mean - fastest) / fastest * 100.0;
  return slowest;
}

}  // namespace tinyddp::bench
