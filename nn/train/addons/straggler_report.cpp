#include "tinyddp/nn/train/addons/straggler_report.h"

#include <algorithm>
#include <cstdio>

namespace tinyddp::nn {

namespace {

std::string seconds(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f s", s);
  return text;
}

// Below this spread between the ranks, no rank is called a straggler: scheduling noise.
constexpr double kNoiseSeconds = 0.05;

}  // namespace

std::string straggler_line(int rank, int64_t epoch, uint64_t collectives, const std::vector<double>& seconds_by_rank) {
  const auto lowest = std::min_element(seconds_by_rank.begin(), seconds_by_rank.end());
  const int slowest = int(lowest - seconds_by_rank.begin());
  const double mine = seconds_by_rank.at(size_t(rank));
  const double spread = *std::max_element(seconds_by_rank.begin(), seconds_by_rank.end()) - *lowest;
  std::string per_rank;
  for (size_t r = 0; r < seconds_by_rank.size(); ++r)
    per_rank += (r ? ", " : "") + std::to_string(r) + ": " + seconds(seconds_by_rank[r]);
  std::string line = "epoch " + std::to_string(epoch) + ": rank " + std::to_string(rank) + " spent " + seconds(mine) +
                     " in " + std::to_string(collectives) + " collectives";
  if (spread < kNoiseSeconds)
    line += "; no rank waited notably for another";
  else if (rank == slowest)
    line += ", the least of all ranks: it is the slowest, the others waited up to " + seconds(spread) + " for it";
  else
    line += ", " + seconds(mine - *lowest) + " more than rank " + std::to_string(slowest) +
            ", the slowest: that is about how long it waited for rank " + std::to_string(slowest);
  return line + " (per rank: " + per_rank + ")";
}

}  // namespace tinyddp::nn
