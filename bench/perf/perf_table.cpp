#include "bench/perf/perf_table.h"

#include <ctime>

#include "bench/perf/perf_collective.h"
#include "bench/perf/perf_job.h"
#include "bench/perf/perf_options.h"

namespace tinyddp::bench {
namespace {

// The nccl-tests release whose output layout and JSON schema these programs follow.
constexpr const char* kNcclTestsFormat = "2.19.6";

// One placement's columns: time, algbw, busbw, #wrong, then with -I 1 nccl-tests' i_min, i_max,
// i_p99 and i_cv%. A placement that did not run shows N/A in each.
std::string placement_columns(const PlacementResult& r, bool per_iteration) {
  char text[160];
  if (!r.ran) {
    std::snprintf(text, sizeof text, "  %7s  %6s  %6s  %6s", "N/A", "N/A", "N/A", "N/A");
  } else if (r.wrong < 0) {
    std::snprintf(text, sizeof text, "  %7s  %6s  %6s    N/A", fit_number(r.time_us, 7).c_str(),
                  fit_number(r.algbw, 6).c_str(), fit_number(r.busbw, 6).c_str());
  } else {
    std::snprintf(text, sizeof text, "  %7s  %6s  %6s  %6g", fit_number(r.time_us, 7).c_str(),
                  fit_number(r.algbw, 6).c_str(), fit_number(r.busbw, 6).c_str(), double(r.wrong));
  }
  std::string columns = text;
  if (!per_iteration) return columns;
  if (!r.ran) {
    std::snprintf(text, sizeof text, "  %7s  %7s  %7s  %7s", "N/A", "N/A", "N/A", "N/A");
  } else {
    const IterationStats& s = r.stats;
    std::snprintf(text, sizeof text, "  %7s  %7s  %7s  %7s", fit_number(s.min, 7).c_str(), fit_number(s.max, 7).c_str(),
                  fit_number(s.p99, 7).c_str(), fit_number(s.cv_pct(), 7).c_str());
  }
  return columns + text;
}

// tinyddp's own -I 1 columns for one placement: p50, p95, the slowest rank and its lag in percent.
// Both placements' groups sit at the end of the row, so their labels name the placement (oop_, ip_).
std::string spread_columns(const PlacementResult& r) {
  char text[96];
  if (!r.ran) {
    std::snprintf(text, sizeof text, "  %7s  %7s  %8s  %8s", "N/A", "N/A", "N/A", "N/A");
  } else {
    std::snprintf(text, sizeof text, "  %7s  %7s  %8d  %8s", fit_number(r.stats.p50, 7).c_str(),
                  fit_number(r.stats.p95, 7).c_str(), r.slowest.rank, fit_number(r.slowest.spread_pct, 7).c_str());
  }
  return text;
}

}  // namespace

std::string fit_number(double value, int width) {
  char text[64];
  for (const char* format : {"%*.2f", "%*.1f", "%*.0f"})
    if (std::snprintf(text, sizeof text, format, width, value) <= width) return text;
  std::snprintf(text, sizeof text, width >= 7 ? "%*.1e" : "%*.0e", width, value);
  return text;
}

std::string timestamp_now() {
  std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%d %H:%M:%S", &local);
  return text;
}

void PerfTable::header(const PerfJob& job, const std::string& json_file) const {
  const PerfOptions& o = options_;
  if (!json_file.empty()) std::fprintf(out_, "# Writing JSON output to %s\n", json_file.c_str());
  std::fprintf(out_, "# tinyddp collective test, nccl-tests %s format: backend %s, algo %s, transport %s, world %d\n",
               kNcclTestsFormat, o.backend.c_str(), o.algo.c_str(), job.transport().c_str(), job.world());
  std::fprintf(out_, "# Collective test starting: %s\n", o.program.c_str());
  std::fprintf(out_,
               "# nThread 1 nGpus 1 minBytes %zu maxBytes %zu step: %zu(%s) warmup iters: %d iters: %d agg iters: %d "
               "validation: %d graph: 0 unalign: %lld\n",
               o.min_bytes, o.max_bytes, o.step_factor > 1 ? o.step_factor : o.step_bytes,
               o.step_factor > 1 ? "factor" : "bytes", o.warmup_iters, o.iters, o.agg_iters, int(o.check),
               static_cast<long long>(o.unalign));
  if (o.blocking)
    std::fprintf(out_, "# Blocking Enabled: wait after each collective, no barrier (nccl-tests' -z 2) \n");
  if (o.rewrite)
    std::fprintf(out_,
                 "# Input rewritten by its rank before each timed call (--rewrite 1), the writes' time left out\n");
  if (o.per_iter_timing) {
    std::fprintf(
        out_,
        "# Per-Iteration Report: host wall-clock, each iteration awaited before the next (as nccl-tests' -z 3); "
        "i_* uses max over process rows");
    if (o.per_iter_skip) std::fprintf(out_, "; summary skips first %d iterations", o.per_iter_skip);
    std::fprintf(out_, " \n");
  }
  std::fprintf(out_, "#\n# Using devices\n");
  for (const RankInfo& r : job.ranks())
    std::fprintf(out_, "#  Rank %2d Group  0 Pid %6d on %10s device %2d [%s] %s\n", r.rank, r.pid, r.hostname.c_str(),
                 r.device, r.device_hex.c_str(), r.device_info.c_str());
  column_headings();
  std::fflush(out_);
}

void PerfTable::column_headings() const {
  const bool per_iter = options_.per_iter_timing;
  const int ts_pad = options_.report_timestamps ? 19 : 0;
  const char* ts_label = options_.report_timestamps ? "timestamp" : "";
  const char* ts_format = options_.report_timestamps ? "%Y-%m-%d %H:%M:%S" : "";
  std::fprintf(out_, "#\n");
  if (!per_iter) {
    std::fprintf(out_, "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          \n",
                 "", "", "", "", "");
    std::fprintf(out_, "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %*s\n", "size", "count",
                 "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong",
                 ts_pad, ts_label);
    std::fprintf(out_, "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %*s\n", "(B)", "(elements)",
                 "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "", ts_pad, ts_format);
    return;
  }
  std::fprintf(out_,
               "# %10s  %12s  %8s  %6s  %6s              out-of-place (+ per-iteration)                                "
               "in-place (+ per-iteration)             out-of-place: spread, slowest   in-place: spread, slowest\n",
               "", "", "", "", "");
  const char* row =
      "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %7s  %7s  %7s  %7s  %6s  %6s  %6s  %7s  %7s  %7s  "
      "%7s  %7s  %7s  %8s  %8s  %7s  %7s  %8s  %8s %*s\n";
  std::fprintf(out_, row, "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "i_min",
               "i_max", "i_p99", "i_cv%", "time", "algbw", "busbw", "#wrong", "i_min", "i_max", "i_p99", "i_cv%",
               "oop_p50", "oop_p95", "oop_slow", "oop_lag%", "ip_p50", "ip_p95", "ip_slow", "ip_lag%", ts_pad,
               ts_label);
  std::fprintf(out_, row, "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(us)", "(us)",
               "(%)", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(us)", "(us)", "(%)", "(us)", "(us)", "(rank)", "",
               "(us)", "(us)", "(rank)", "", ts_pad, ts_format);
}

void PerfTable::row(const ResultRow& r) const {
  const bool per_iter = options_.per_iter_timing;
  std::string line(128, '\0');
  line.resize(size_t(std::snprintf(line.data(), line.size(), "%12zu  %12zu  %8s  %6s  %6d", r.bytes, r.count,
                                   r.type.c_str(), r.redop.c_str(), r.root)));
  line += placement_columns(r.out_of_place, per_iter) + placement_columns(r.in_place, per_iter);
  if (per_iter) line += spread_columns(r.out_of_place) + spread_columns(r.in_place);
  if (options_.report_timestamps) line += "  " + r.finished_at;
  std::fprintf(out_, "%s\n", line.c_str());
  std::fflush(out_);
}

void PerfTable::footer(int64_t failed_checks, double avg_busbw, double min_busbw, const std::string& error) const {
  const char* verdict = min_busbw < 0 ? "" : avg_busbw < min_busbw * 0.9 ? "FAILED" : "OK";
  std::fprintf(out_, "# %-20s : %lld %s\n", "Out of bounds values", static_cast<long long>(failed_checks),
               failed_checks ? "FAILED" : "OK");
  std::fprintf(out_, "# %-20s : %g %s\n", "Avg bus bandwidth", avg_busbw, verdict);
  std::fprintf(out_, "#\n# Collective test concluded: %s\n#\n", options_.program.c_str());
  if (error.empty())
    std::fprintf(out_, "\n");
  else
    std::fprintf(out_, "# error: %s\n", error.c_str());
  std::fflush(out_);
}

}  // namespace tinyddp::bench
