// all_gather_perf: all-gather: every rank ends with every rank's part, in rank order.
// nccl-tests' program of the same name, on tinyddp's collectives: the same flags, table and JSON
// (bench/perf/perf_main.h; run with --help for the flags and their defaults).
//
//   tinyddp-run -n 4 build/bin/all_gather_perf -b 8 -e 128M -f 2
#include "bench/perf/perf_main.h"

int main(int argc, char** argv) {
  return tinyddp::bench::perf_main(argc, argv, tinyddp::bench::all_gather_collective());
}
