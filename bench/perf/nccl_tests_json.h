// NcclTestsJson: -J FILE, the JSON nccl-tests writes (its src/util.cu, file version 3), key for key
// and type for type, so that its tools (tools/analyze_perf_json.py) and anyone's scripts for it read
// our files unchanged:
//
//   {"version": 3, "start_time", "args", "env", "nccl_version",
//    "config": {"nthreads", "ngpus", "minimum_bytes", "maximum_bytes", "step_factor" | "step_bytes",
//               "warmup_iters", "iterations", "aggregated_iterations", "validation", "graph",
//               "blocking_collectives", "per_iter_timing", "per_iter_skip", "parallel_init",
//               "devices": [{"rank", "group", "pid", "hostname", "device", "device_hex", "device_info"}]},
//    "results": [{"size", "count", "type", "redop", "root",
//                 "out_of_place": {"time", "alg_bw", "bus_bw", "nwrong"} | null, "out_of_place_per_iter",
//                 "in_place": {...}, "in_place_per_iter", "actual_iterations", "experiment_name"}],
//    "out_of_bounds": {"count", "okay"}, "average_bus_bandwidth": {"bandwidth", "okay"},
//    "errors": [...], "end_time"}
//
// nccl-tests' own quirks are kept, since readers depend on them: booleans are the strings "true"
// and "false", "root" is the table's six-character text ("    -1"), "nwrong" is a number or null,
// a NaN is the string "nan". The *_per_iter objects (-I 1) hold min_us, max_us, avg_us, p50_us,
// p95_us, p99_us, stdev_us, cv_pct, times_us (per iteration, the slowest rank's time) and, with
// more than one rank, per_process_max_times_us (every rank's own times). One key of tinyddp's own,
// "tinyddp", says what nccl-tests has no key for: backend, algorithm, the transport used, the device.
// "env" is the environment, as nccl-tests records it, with the values of names that look secret
// (TOKEN, SECRET, PASSWORD, KEY) replaced by "<redacted>".
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "bench/perf/perf_result.h"

namespace tinyddp::bench {

struct PerfOptions;
class PerfCollective;
class PerfJob;

class NcclTestsJson {
 public:
  // Creates the file at once and never over an existing one, as nccl-tests does: `path`, else
  // path.0, path.1, ... Returns the name it created; throws when it cannot create any.
  static std::string create_file(const std::string& path);

  NcclTestsJson(std::string file, const PerfOptions& options, const PerfCollective& collective, const PerfJob& job);
  void row(const ResultRow& row);
  // Completes the document and writes it to the file.
  void finish(int64_t failed_checks, double avg_busbw, double min_busbw, const std::string& error);

 private:
  std::string file_;
  nlohmann::ordered_json doc_;
  const PerfOptions& options_;
};

}  // namespace tinyddp::bench
