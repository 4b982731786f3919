#include "bench/perf/nccl_tests_json.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>

#include "bench/perf/perf_collective.h"
#include "bench/perf/perf_job.h"
#include "bench/perf/perf_options.h"
#include "bench/perf/perf_table.h"

extern char** environ;

namespace tinyddp::bench {
namespace {

using Json = nlohmann::ordered_json;

constexpr int kJsonFileVersion = 3;

// nccl-tests writes booleans as strings.
Json flag(bool value) { return value ? "true" : "false"; }

// nccl-tests writes a NaN as the string "nan" (and JSON has no infinity either).
Json number(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  return value;
}

Json environment() {
  Json env = Json::array();
  for (char** e = environ; *e; ++e) {
    std::string entry = *e;
    std::string name = entry.substr(0, entry.find('='));
    std::string upper = name;
    std::transform(upper.begin(), upper.end(), upper.begin(), [](unsigned char c) { return char(std::toupper(c)); });
    bool secret = false;
    for (const char* word : {"TOKEN", "SECRET", "PASSWORD", "KEY"}) secret |= upper.find(word) != std::string::npos;
    env.push_back(secret ? name + "=<redacted>" : entry);
  }
  return env;
}

Json config(const PerfOptions& o, const PerfJob& job) {
  Json c;
  c["nthreads"] = 1;
  c["ngpus"] = 1;
  c["minimum_bytes"] = o.min_bytes;
  c["maximum_bytes"] = o.max_bytes;
  if (o.step_factor > 1)
    c["step_factor"] = o.step_factor;
  else
    c["step_bytes"] = o.step_bytes;
  c["warmup_iters"] = o.warmup_iters;
  c["iterations"] = o.iters;
  c["aggregated_iterations"] = o.agg_iters;
  c["validation"] = int(o.check);
  c["graph"] = 0;
  c["blocking_collectives"] = flag(o.blocking);
  c["per_iter_timing"] = flag(o.per_iter_timing);
  c["per_iter_skip"] = o.per_iter_skip;
  c["parallel_init"] = flag(false);
  c["devices"] = Json::array();
  for (const RankInfo& r : job.ranks())
    c["devices"].push_back({{"rank", r.rank},
                            {"group", 0},
                            {"pid", r.pid},
                            {"hostname", r.hostname},
                            {"device", r.device},
                            {"device_hex", r.device_hex},
                            {"device_info", r.device_info}});
  return c;
}

Json placement(const PlacementResult& r) {
  if (!r.ran) return nullptr;
  return {{"time", number(r.time_us)},
          {"alg_bw", number(r.algbw)},
          {"bus_bw", number(r.busbw)},
          {"nwrong", r.wrong < 0 ? Json(nullptr) : Json(double(r.wrong))}};
}

Json per_iteration(const PlacementResult& r) {
  const IterationStats& s = r.stats;
  Json j = {{"skipped_iterations", r.skipped_iterations},
            {"min_us", number(s.min)},
            {"max_us", number(s.max)},
            {"avg_us", number(s.avg)},
            {"p50_us", number(s.p50)},
            {"p95_us", number(s.p95)},
            {"p99_us", number(s.p99)},
            {"stdev_us", number(s.stdev)},
            {"cv_pct", number(s.cv_pct())}};
  j["times_us"] = Json::array();
  for (double t : r.iteration_us) j["times_us"].push_back(number(t));
  if (r.rank_iteration_us.size() > 1) {
    j["per_process_max_times_us"] = Json::array();
    for (const auto& times : r.rank_iteration_us) {
      Json row = Json::array();
      for (double t : times) row.push_back(number(t));
      j["per_process_max_times_us"].push_back(row);
    }
  }
  return j;
}

}  // namespace

std::string NcclTestsJson::create_file(const std::string& path) {
  std::string attempt = path;
  for (int n = 0;; ++n) {
    int fd = ::open(attempt.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd >= 0) {
      ::close(fd);
      return attempt;
    }
    if (errno != EEXIST || n > 9999)
      throw UsageError("-J " + path + ": cannot create " + attempt + " (" + std::strerror(errno) +
                       "); hint: name a file in a directory that exists and that you can write");
    attempt = path + "." + std::to_string(n);
  }
}

NcclTestsJson::NcclTestsJson(std::string file, const PerfOptions& options, const PerfCollective& collective,
                             const PerfJob& job)
    : file_(std::move(file)), options_(options) {
  doc_["version"] = kJsonFileVersion;
  doc_["start_time"] = timestamp_now();
  doc_["args"] = options.argv;
  doc_["env"] = environment();
  doc_["nccl_version"] = 0;  // not NCCL's: the backend may not be NCCL at all
  doc_["tinyddp"] = {{"program", options.program}, {"collective", collective.name()}, {"backend", options.backend},
                     {"algo", options.algo},       {"transport", job.transport()},    {"device", job.device().str()},
                     {"world_size", job.world()},  {"timing", "host wall-clock"}};
  doc_["config"] = config(options, job);
  doc_["results"] = Json::array();
}

void NcclTestsJson::row(const ResultRow& r) {
  char root[16];
  std::snprintf(root, sizeof root, "%6d", r.root);
  Json j = {{"size", r.bytes}, {"count", r.count}, {"type", r.type}, {"redop", r.redop}, {"root", root}};
  j["out_of_place"] = placement(r.out_of_place);
  if (options_.per_iter_timing && r.out_of_place.ran) j["out_of_place_per_iter"] = per_iteration(r.out_of_place);
  j["in_place"] = placement(r.in_place);
  if (options_.per_iter_timing && r.in_place.ran) j["in_place_per_iter"] = per_iteration(r.in_place);
  j["actual_iterations"] = r.iterations;
  j["experiment_name"] = "";
  doc_["results"].push_back(std::move(j));
}

void NcclTestsJson::finish(int64_t failed_checks, double avg_busbw, double min_busbw, const std::string& error) {
  doc_["out_of_bounds"] = {{"count", failed_checks}, {"okay", flag(failed_checks == 0)}};
  doc_["average_bus_bandwidth"] = {{"bandwidth", number(avg_busbw)},
                                   {"okay", min_busbw < 0 ? Json("unchecked") : flag(avg_busbw >= min_busbw * 0.9)}};
  doc_["errors"] = error.empty() ? Json::array() : Json::array({error});
  doc_["end_time"] = timestamp_now();
  std::ofstream out(file_);
  out << doc_.dump() << "\n";
  if (!out) throw std::runtime_error("-J: writing " + file_ + " failed");
}

}  // namespace tinyddp::bench
