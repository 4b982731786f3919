// PerfTable: the table on standard output, in nccl-tests' layout (its src/util.cu), so that the
// scripts that read nccl-tests' output read ours: the same header lines, the same columns and
// widths (size, count, type, redop, root, then time, algbw, busbw and #wrong out of place and in
// place), the same "# Out of bounds values" and "# Avg bus bandwidth" lines.
//
// With -I 1 each placement also gets nccl-tests' i_min, i_max, i_p99 and i_cv% columns, and the row
// ends with tinyddp's own, labelled oop_ and ip_ for the placement they belong to: the median and p95
// iteration, the slowest rank (the one whose iterations took longest on average) and how much slower
// it was than the fastest, so that a straggler shows in the table itself.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "bench/perf/perf_result.h"

namespace tinyddp::bench {

struct PerfOptions;
class PerfCollective;
class PerfJob;

class PerfTable {
 public:
  PerfTable(const PerfOptions& options, const PerfCollective& collective, std::FILE* out = stdout)
      : options_(options), collective_(collective), out_(out) {}

  // Everything above the first row; `json_file` is where the JSON goes ("" for none).
  void header(const PerfJob& job, const std::string& json_file) const;
  void row(const ResultRow& row) const;
  // `min_busbw`: NCCL_TESTS_MIN_BW, or a negative value when unset.
  void footer(int64_t failed_checks, double avg_busbw, double min_busbw, const std::string& error) const;

 private:
  void column_headings() const;

  const PerfOptions& options_;
  const PerfCollective& collective_;
  std::FILE* out_;
};

// nccl-tests' number format: `value` in `width` characters, with 2, 1 or 0 decimals, whichever fits
// first, else in exponent form.
std::string fit_number(double value, int width);

// Now, as "%Y-%m-%d %H:%M:%S" in local time (nccl-tests' timestamps).
std::string timestamp_now();

}  // namespace tinyddp::bench
