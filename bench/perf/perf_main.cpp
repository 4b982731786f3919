#include "bench/perf/perf_main.h"

#include <cstdio>
#include <cstdlib>
#include <optional>

#include "bench/perf/memory_check.h"
#include "bench/perf/nccl_tests_json.h"
#include "bench/perf/perf_check.h"
#include "bench/perf/perf_csv.h"
#include "bench/perf/perf_job.h"
#include "bench/perf/perf_options.h"
#include "bench/perf/perf_table.h"
#include "bench/perf/perf_timing.h"

namespace tinyddp::bench {
namespace {

// A rank refused to start; whoever had something to say has said it.
struct StartRefused {};

// The reports rank 0 writes.
struct Reports {
  std::optional<PerfTable> table;
  std::optional<NcclTestsJson> json;
  std::optional<PerfCsv> csv;

  void row(const ResultRow& r) {
    table->row(r);
    if (json) json->row(r);
    if (csv) csv->row(r);
  }
  void finish(int64_t failed_checks, double avg_busbw, const std::string& error) {
    const char* min_bw = std::getenv("NCCL_TESTS_MIN_BW");  // nccl-tests' pass mark
    double min_busbw = min_bw ? std::atof(min_bw) : -1;
    table->footer(failed_checks, avg_busbw, min_busbw, error);
    if (json) json->finish(failed_checks, avg_busbw, min_busbw, error);
  }
};

// Every rank learns whether any rank has a problem; the ranks that should say it do, and all stop.
void agree_to_start(PerfJob& job, const PerfOptions& o, const std::string& problem, bool say_it) {
  if (job.max(problem.empty() ? 0 : 1) == 0) return;
  if (!problem.empty() && say_it) std::fprintf(stderr, "%s: %s\n", o.program.c_str(), problem.c_str());
  throw StartRefused{};
}

// The checks that need the world, then the output files: all before any buffer is allocated.
std::optional<Reports> prepare(PerfJob& job, const PerfOptions& o, const PerfCollective& c) {
  std::string problem;
  bool say_it = false;
  if (c.has_root() && !o.all_roots && o.root >= job.world()) {
    problem = "-r " + std::to_string(o.root) + ": the world has " + std::to_string(job.world()) + " rank(s), 0 to " +
              std::to_string(job.world() - 1);
    say_it = job.rank() == 0;
  } else {
    problem = memory_refusal(o, c, job.world(), job.device(), job.ranks_on_this_host());
    say_it = job.first_on_this_host();
  }
  agree_to_start(job, o, problem, say_it);

  std::optional<Reports> reports;
  if (job.rank() == 0) {
    try {
      reports.emplace();
      std::string json_file = o.json_file.empty() ? "" : NcclTestsJson::create_file(o.json_file);
      if (json_file != o.json_file)  // said on stderr too: the table's own line is easily missed
        std::fprintf(stderr,
                     "%s: -J %s: that file exists, so this run writes %s (as nccl-tests does, -J never "
                     "overwrites); hint: remove %s or name another file to write there\n",
                     o.program.c_str(), o.json_file.c_str(), json_file.c_str(), o.json_file.c_str());
      if (!json_file.empty()) reports->json.emplace(json_file, o, c, job);
      if (!o.csv_file.empty()) reports->csv.emplace(o.csv_file, o, c, job);
      reports->table.emplace(o, c);
      reports->table->header(job, json_file);
    } catch (const std::exception& e) {
      problem = e.what();
    }
  }
  agree_to_start(job, o, problem, true);
  return reports;
}

// The two buffers of one type, sized for -e, written once before anything is timed (memory never
// written reads as the kernel's shared zero page, which is always in cache, and makes large rows
// look faster than any real buffer can be), then shifted by -u elements.
struct Buffers {
  Tensor send, recv;
};

Buffers allocate(PerfJob& job, const PerfOptions& o, const PerfCollective& c, DType type) {
  const size_t elem = dtype_size(type);
  CollectiveCounts most = c.counts(o.max_bytes / elem, elem, job.world());
  TestValues values(comm::ReduceOp::sum, job.world(), 0, type);
  auto make = [&](size_t count) {
    // -R 2: every rank allocates its buffers in symmetric memory, in the same order (a collective call).
    Tensor t = o.registration == 2 ? job.group().allocate_symmetric({int64_t(count) + o.unalign}, type)
                                   : Tensor::empty({int64_t(count) + o.unalign}, type, job.device());
    write_elements(t, [&](size_t j) { return values.input(job.rank(), j); });
    return t.view(o.unalign, {int64_t(count)});
  };
  Buffers b;
  if (c.needs_send_buffer()) b.send = make(most.send);
  b.recv = make(most.recv);
  return b;
}

// The time across ranks, as -a says: rank 0's, the mean, the fastest or the slowest.
double across_ranks(const std::vector<double>& per_rank, int average) {
  double pick = per_rank[0], sum = 0;
  for (double s : per_rank) {
    sum += s;
    if (average == 2) pick = std::min(pick, s);
    if (average == 3) pick = std::max(pick, s);
  }
  return average == 1 ? sum / double(per_rank.size()) : pick;
}

// -I 1: every rank's iterations, each iteration's slowest rank, and their spread.
void add_per_iteration(PlacementResult& r, const std::vector<double>& gathered, size_t stride, const PerfOptions& o) {
  const size_t iters = size_t(o.iters), world = gathered.size() / stride;
  r.per_iteration = true;
  r.skipped_iterations = o.per_iter_skip;
  r.iteration_us.assign(iters, 0.0);
  std::vector<std::vector<double>> summarised(world);
  for (size_t rank = 0; rank < world; ++rank) {
    std::vector<double> times(iters);
    for (size_t i = 0; i < iters; ++i) {
      times[i] = gathered[rank * stride + 1 + i] * 1e6;
      r.iteration_us[i] = std::max(r.iteration_us[i], times[i]);
    }
    summarised[rank].assign(times.begin() + o.per_iter_skip, times.end());
    r.rank_iteration_us.push_back(std::move(times));
  }
  r.stats = iteration_stats({r.iteration_us.begin() + o.per_iter_skip, r.iteration_us.end()});
  r.slowest = slowest_rank(summarised);
}

struct RowContext {
  const PerfCollective& collective;
  const PerfOptions& options;
  comm::ReduceOp op;
  int root;
  CollectiveCounts counts;
  size_t bytes;
};

// Times one placement on every rank and gathers the figures; checks it with -c 1.
PlacementResult measure(PerfJob& job, const RowContext& row, const Placement& p, uint32_t seed,
                        int64_t& failed_checks) {
  const PerfOptions& o = row.options;
  LocalTiming t = time_placement(job.group(), row.collective, p, row.op, row.root, o);
  std::vector<double> mine{t.seconds};
  mine.insert(mine.end(), t.iteration_seconds.begin(), t.iteration_seconds.end());
  const size_t stride = mine.size();
  const std::vector<double> gathered = job.all_gather(mine);
  std::vector<double> per_rank;
  for (size_t at = 0; at < gathered.size(); at += stride) per_rank.push_back(gathered[at]);

  PlacementResult r;
  r.ran = true;
  const double seconds = across_ranks(per_rank, o.average);
  r.time_us = seconds * 1e6;
  r.algbw = seconds > 0 ? double(row.bytes) / seconds / 1e9 : 0.0;
  r.busbw = r.algbw * row.collective.bus_factor(job.world());
  if (o.per_iter_timing) add_per_iteration(r, gathered, stride, o);
  if (o.check) {
    TestValues values(row.op, job.world(), seed, p.output.dtype());
    int64_t wrong = check_placement(job.group(), row.collective, p, row.counts, values, row.op, row.root);
    r.wrong = 0;
    for (double w : job.all_gather({double(wrong)})) {
      r.wrong += int64_t(w);
      failed_checks += w > 0;
    }
  }
  return r;
}

struct SweepTotals {
  double busbw_sum = 0;
  int placements = 0;
  int64_t failed_checks = 0;
  uint32_t checks = 0;  // the seed of the next check's values
};

ResultRow run_row(PerfJob& job, const Buffers& b, const RowContext& row, DType type, SweepTotals& totals) {
  const PerfCollective& c = row.collective;
  ResultRow r;
  r.bytes = std::max(row.counts.send, row.counts.recv) * dtype_size(type);
  r.count = row.counts.param;
  r.type = nccl_type_name(type);
  r.redop = c.reduces() ? comm::reduce_op_name(row.op) : "none";
  r.root = c.has_root() ? row.root : -1;
  r.iterations = row.options.iters;
  for (bool in_place : {false, true}) {
    if (!in_place && !c.has_out_of_place()) continue;
    Placement p = c.place(b.send, b.recv, row.counts, in_place, job.rank());
    PlacementResult& result = in_place ? r.in_place : r.out_of_place;
    result = measure(job, row, p, ++totals.checks, totals.failed_checks);
    totals.busbw_sum += result.busbw;
    ++totals.placements;
  }
  if (row.options.report_timestamps) r.finished_at = timestamp_now();
  return r;
}

// Every row of one type, op and root, -N times.
void sweep(PerfJob& job, const Buffers& b, const PerfOptions& o, const PerfCollective& c, DType type, comm::ReduceOp op,
           int root, std::optional<Reports>& reports, SweepTotals& totals) {
  const size_t elem = dtype_size(type);
  const std::vector<size_t> sizes = o.sizes();
  for (int cycle = 0; o.run_cycles == 0 || cycle < o.run_cycles; ++cycle)
    for (size_t bytes : sizes) {
      RowContext row{c, o, op, root, c.counts(bytes / elem, elem, job.world()), 0};
      row.bytes = std::max(row.counts.send, row.counts.recv) * elem;
      ResultRow r = run_row(job, b, row, type, totals);
      if (reports) reports->row(r);
    }
}

int run(const PerfOptions& o, const PerfCollective& c) {
  PerfJob job = PerfJob::start(o, c);
  std::optional<Reports> reports = prepare(job, o, c);
  SweepTotals totals;
  std::vector<int> roots{o.root};
  if (c.has_root() && o.all_roots)
    for (int r = 1; r < job.world(); ++r) roots.push_back(r);
  const std::vector<comm::ReduceOp> ops = c.reduces() ? o.ops : std::vector<comm::ReduceOp>{comm::ReduceOp::sum};
  try {
    for (DType type : o.types) {
      Buffers buffers = allocate(job, o, c, type);
      for (comm::ReduceOp op : ops)
        for (int root : roots) sweep(job, buffers, o, c, type, op, root, reports, totals);
    }
  } catch (const std::exception& e) {
    if (reports)
      reports->finish(totals.failed_checks, totals.placements ? totals.busbw_sum / totals.placements : 0.0, e.what());
    job.report_failure(e.what());
    throw;
  }
  const double avg = totals.placements ? totals.busbw_sum / totals.placements : 0.0;
  if (reports) reports->finish(totals.failed_checks, avg, "");
  job.barrier();  // rank 0 hosts the store: nobody leaves before everyone is done
  const char* min_bw = std::getenv("NCCL_TESTS_MIN_BW");
  const bool too_slow = min_bw && avg < std::atof(min_bw) * 0.9;
  return totals.failed_checks == 0 && !too_slow ? 0 : 1;
}

// Whether this process should print a usage error: rank 0, or a process no launcher started.
bool speaks_for_the_job() {
  try {
    return comm::read_launch_environment().rank <= 0;
  } catch (const std::exception&) {
    return true;
  }
}

}  // namespace

int perf_main(int argc, char** argv, const PerfCollective& collective) {
  const std::string program = std::string(argv[0]).substr(std::string(argv[0]).find_last_of('/') + 1);
  try {
    std::optional<PerfOptions> options = parse_perf_options(argc, argv, collective);
    if (!options) return 0;
    return run(*options, collective);
  } catch (const UsageError& e) {
    if (speaks_for_the_job()) std::fprintf(stderr, "%s: %s\n", program.c_str(), e.what());
    return 2;
  } catch (const StartRefused&) {
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", program.c_str(), e.what());
    return 1;
  }
}

}  // namespace tinyddp::bench
