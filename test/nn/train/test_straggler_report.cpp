// The straggler view's arithmetic: each rank's time in collectives minus the slowest rank's is what
// it waited for that rank.
#include <doctest/doctest.h>

#include "tinyddp/nn/train/addons/straggler_report.h"

using namespace tinyddp::nn;

TEST_CASE("straggler report: the rank with the least time in collectives is the one the others wait for") {
  const std::vector<double> seconds{2.31, 0.12, 2.29};
  CHECK(straggler_line(0, 3, 40, seconds) ==
        "epoch 3: rank 0 spent 2.31 s in 40 collectives, 2.19 s more than rank 1, the slowest: that is about how "
        "long it waited for rank 1 (per rank: 0: 2.31 s, 1: 0.12 s, 2: 2.29 s)");
  CHECK(straggler_line(1, 3, 40, seconds) ==
        "epoch 3: rank 1 spent 0.12 s in 40 collectives, the least of all ranks: it is the slowest, the others waited "
        "up to 2.19 s for it (per rank: 0: 2.31 s, 1: 0.12 s, 2: 2.29 s)");
  CHECK(straggler_line(2, 0, 5, {0.50, 0.52, 0.51}) ==
        "epoch 0: rank 2 spent 0.51 s in 5 collectives; no rank waited notably for another (per rank: 0: 0.50 s, "
        "1: 0.52 s, 2: 0.51 s)");
}
