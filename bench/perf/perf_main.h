// perf_main: the whole of a collective benchmark program (all_reduce_perf, all_gather_perf, ...),
// given its collective:
//
//   int main(int argc, char** argv) { return tinyddp::bench::perf_main(argc, argv, all_reduce_collective()); }
//
// It reads the flags (perf_options.h), meets the other ranks (perf_job.h), refuses before
// allocating anything what cannot run (a root beyond the world, buffers beyond the memory, an
// output file it cannot create), then for every type, op and root asked, and every size from -b
// to -e, times each placement (perf_timing.h), checks it (perf_check.h), and reports the row: the
// table on rank 0's standard output (perf_table.h), nccl-tests' JSON (nccl_tests_json.h), the CSV.
//
// Exit status: 0 when every check passed, 1 when a result was wrong or the run failed, 2 for a
// usage error (the message names the flag).
#pragma once

#include "bench/perf/perf_collective.h"

namespace tinyddp::bench {

int perf_main(int argc, char** argv, const PerfCollective& collective);

}  // namespace tinyddp::bench
