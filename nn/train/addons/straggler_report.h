// Straggler report: which rank the others wait for, from each rank's time inside collectives.
//
// Every rank of a data-parallel job moves the same bytes in the same collectives, so the time a
// rank spends inside them differs from another's by how long it waited: a rank that arrives late
// at each all-reduce spends the least time in it, and every other rank spends about that much
// more, waiting. Given every rank's seconds in collectives over an epoch (ProcessGroup::
// time_in_collectives, summed over the ranks by the Trace add-on), the report is one line per rank:
//
//   epoch 3: rank 0 spent 2.31 s in 40 collectives, 2.19 s more than rank 1, the slowest: that is
//   about how long it waited for rank 1 (per rank: 0: 2.31 s, 1: 0.12 s, 2: 2.29 s)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tinyddp::nn {

// The line above for `rank`, given everyone's seconds in collectives (by rank) and this rank's count.
std::string straggler_line(int rank, int64_t epoch, uint64_t collectives, const std::vector<double>& seconds_by_rank);

}  // namespace tinyddp::nn
