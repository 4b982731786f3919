#include "bench/perf/perf_csv.h"

#include <cerrno>
#include <cstring>
#include <sstream>

#include "bench/perf/perf_collective.h"
#include "bench/perf/perf_job.h"
#include "bench/perf/perf_options.h"

namespace tinyddp::bench {
namespace {

std::string placement_cells(const PlacementResult& r, bool per_iteration) {
  std::ostringstream cells;
  if (r.ran)
    cells << r.time_us << "," << r.algbw << "," << r.busbw << ",";
  else
    cells << ",,,";
  if (r.ran && r.wrong >= 0) cells << r.wrong;
  cells << ",";
  if (r.ran && per_iteration)
    cells << r.stats.p50 << "," << r.stats.p95 << "," << r.stats.p99 << "," << r.slowest.rank << "," << r.slowest.mean;
  else
    cells << ",,,,";
  return cells.str();
}

}  // namespace

PerfCsv::PerfCsv(const std::string& file, const PerfOptions& options, const PerfCollective& collective,
                 const PerfJob& job)
    : out_(file), file_(file), per_iteration_(options.per_iter_timing) {
  if (!out_)
    throw UsageError("--csv " + file + ": cannot write it (" + std::strerror(errno) +
                     "); hint: name a file in a directory that exists and that you can write");
  run_columns_ = collective.name() + "," + options.backend + "," + job.transport() + "," + options.algo + "," +
                 std::to_string(job.world());
  out_ << "collective,backend,transport,algo,world,bytes,count,type,redop,root";
  for (const char* p : {"oop_", "ip_"})
    for (const char* c :
         {"time_us", "algbw", "busbw", "wrong", "p50_us", "p95_us", "p99_us", "slowest_rank", "slowest_us"})
      out_ << "," << p << c;
  out_ << "\n";
}

void PerfCsv::row(const ResultRow& r) {
  out_ << run_columns_ << "," << r.bytes << "," << r.count << "," << r.type << "," << r.redop << "," << r.root << ","
       << placement_cells(r.out_of_place, per_iteration_) << "," << placement_cells(r.in_place, per_iteration_) << "\n";
  out_.flush();
  if (!out_) throw std::runtime_error("--csv: writing " + file_ + " failed");
}

}  // namespace tinyddp::bench
