// PerfCsv: --csv FILE, one line per row, for spreadsheets and the comparison scripts. The columns
// say what the run was (collective, backend, the transport actually used, algorithm, world) and
// then the table's figures out of place (oop_) and in place (ip_); the per-iteration columns (-I 1)
// are empty without it, and a figure that was not measured (broadcast out of place, #wrong with
// -c 0) is empty.
#pragma once

#include <fstream>
#include <string>

#include "bench/perf/perf_result.h"

namespace tinyddp::bench {

struct PerfOptions;
class PerfCollective;
class PerfJob;

class PerfCsv {
 public:
  // Opens (truncates) the file and writes the header line; throws when it cannot.
  PerfCsv(const std::string& file, const PerfOptions& options, const PerfCollective& collective, const PerfJob& job);
  void row(const ResultRow& row);

 private:
  std::ofstream out_;
  std::string file_;
  std::string run_columns_;  // collective,backend,transport,algo,world: the same on every line
  bool per_iteration_;
};

}  // namespace tinyddp::bench
