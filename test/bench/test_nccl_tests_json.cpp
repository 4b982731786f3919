// -J FILE read back against nccl-tests' JSON schema (its src/util.cu, file version 3): every key
// its writer writes, with the value types it writes them with, so that nccl-tests' own
// tools/analyze_perf_json.py reads our files; that script too, when a copy of nccl-tests is at hand.
// And the CSV beside it, with the transport actually used.
#include <doctest/doctest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "test/bench/perf_programs.h"
#include "test/test_skip.h"
#include "test/test_support.h"

using namespace tinyddp::testing;
using Json = nlohmann::json;

namespace {

// The keys of `object`, which must be exactly `keys`.
void check_keys(const Json& object, std::vector<std::string> keys, const std::string& where) {
  std::vector<std::string> got;
  for (auto it = object.begin(); it != object.end(); ++it) got.push_back(it.key());
  std::sort(got.begin(), got.end());
  std::sort(keys.begin(), keys.end());
  CHECK_MESSAGE(got == keys, where, ": keys ", Json(got).dump(), ", nccl-tests writes ", Json(keys).dump());
}

bool is_flag(const Json& j) { return j.is_string() && (j == "true" || j == "false"); }  // nccl-tests' booleans

void check_placement(const Json& p, bool checked) {
  check_keys(p, {"time", "alg_bw", "bus_bw", "nwrong"}, "placement");
  CHECK(p["time"].is_number());
  CHECK(p["alg_bw"].is_number());
  CHECK(p["bus_bw"].is_number());
  CHECK((checked ? p["nwrong"].is_number() : p["nwrong"].is_null()));
  if (checked) CHECK(p["nwrong"] == 0);
}

void check_per_iteration(const Json& p, int iters, int world, int skipped) {
  check_keys(p,
             {"skipped_iterations", "min_us", "max_us", "avg_us", "p50_us", "p95_us", "p99_us", "stdev_us", "cv_pct",
              "times_us", "per_process_max_times_us"},
             "per_iter");
  CHECK(p["skipped_iterations"] == skipped);
  REQUIRE(p["times_us"].size() == size_t(iters));
  REQUIRE(p["per_process_max_times_us"].size() == size_t(world));
  // times_us is the slowest process's time at each iteration (the analysis script's consistency check).
  for (int i = 0; i < iters; ++i) {
    double slowest = 0;
    for (const auto& row : p["per_process_max_times_us"]) {
      REQUIRE(row.size() == size_t(iters));
      slowest = std::max(slowest, row[size_t(i)].get<double>());
    }
    CHECK(p["times_us"][size_t(i)].get<double>() == doctest::Approx(slowest));
  }
  std::vector<double> summary(p["times_us"].begin() + skipped, p["times_us"].end());
  CHECK(p["min_us"].get<double>() == *std::min_element(summary.begin(), summary.end()));
  CHECK(p["max_us"].get<double>() == *std::max_element(summary.begin(), summary.end()));
  CHECK(p["p50_us"].get<double>() <= p["p95_us"].get<double>());
  CHECK(p["p95_us"].get<double>() <= p["p99_us"].get<double>());
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// nccl-tests' tools/analyze_perf_json.py, where a copy of nccl-tests can be found.
std::string nccl_tests_analyzer() {
  std::vector<std::string> places;
  if (const char* dir = std::getenv("NCCL_TESTS_DIR"))
    places.push_back(std::string(dir) + "/tools/analyze_perf_json.py");
  places.push_back(std::string(TINYDDP_SOURCE_DIR) + "/../shared/nccl-tests/tools/analyze_perf_json.py");
  for (const auto& p : places)
    if (std::ifstream(p)) return p;
  return "";
}

}  // namespace

TEST_CASE("-J writes nccl-tests' JSON, key for key, and --csv the same rows") {
  if (!built("all_reduce_perf") || !built("tinyddp-run")) {
    TINYDDP_SKIP("build all_reduce_perf and tinyddp-run first");
  }
  TempDir dir;
  const std::string json = dir.file("result.json"), csv = dir.file("result.csv");
  const std::vector<std::string> args = {"-b", "1K", "-e", "64K", "-f",          "8",   "-n", "4",  "-w",    "1",
                                         "-I", "1",  "-K", "1",   "--transport", "shm", "-J", json, "--csv", csv};
  auto run = run_perf("all_reduce_perf", 3, args);
  REQUIRE_MESSAGE(run.ok(), run.describe());
  CHECK(run.report.find("# Writing JSON output to " + json) != std::string::npos);
  const Json doc = Json::parse(read_file(json));

  check_keys(doc,
             {"version", "start_time", "args", "env", "nccl_version", "tinyddp", "config", "results", "out_of_bounds",
              "average_bus_bandwidth", "errors", "end_time"},
             "top level");
  CHECK(doc["version"] == 3);
  CHECK(doc["start_time"].get<std::string>().size() == 19);  // "%Y-%m-%d %H:%M:%S"
  CHECK(doc["end_time"].get<std::string>().size() == 19);
  CHECK(doc["args"].size() == args.size() + 1);
  CHECK(doc["args"].back() == csv);
  CHECK(doc["env"].is_array());
  CHECK(doc["nccl_version"].is_number_integer());
  CHECK(doc["tinyddp"]["transport"] == "shm");
  CHECK(doc["tinyddp"]["backend"] == "host");

  const Json& config = doc["config"];
  check_keys(config,
             {"nthreads", "ngpus", "minimum_bytes", "maximum_bytes", "step_factor", "warmup_iters", "iterations",
              "aggregated_iterations", "validation", "graph", "blocking_collectives", "per_iter_timing",
              "per_iter_skip", "parallel_init", "devices"},
             "config");
  CHECK(config["minimum_bytes"] == 1024);
  CHECK(config["maximum_bytes"] == 65536);
  CHECK(config["step_factor"] == 8);
  CHECK(config["iterations"] == 4);
  CHECK(config["validation"] == 1);
  CHECK(is_flag(config["blocking_collectives"]));
  CHECK(config["per_iter_timing"] == "true");
  CHECK(config["per_iter_skip"] == 1);
  REQUIRE(config["devices"].size() == 3);
  for (int r = 0; r < 3; ++r) {
    const Json& d = config["devices"][size_t(r)];
    check_keys(d, {"rank", "group", "pid", "hostname", "device", "device_hex", "device_info"}, "devices");
    CHECK(d["rank"] == r);
    CHECK(d["pid"].is_number_integer());
    CHECK(d["hostname"].is_string());
    CHECK(d["device"] == -1);
  }

  // -I 1's spread groups, both at the end of the row, each labelled with its placement.
  const size_t labels = run.report.find("oop_p50");
  REQUIRE_MESSAGE(labels != std::string::npos, run.report);
  const std::string heading = run.report.substr(labels, run.report.find('\n', labels) - labels);
  std::istringstream words(heading);
  std::vector<std::string> tail;
  for (std::string w; words >> w;) tail.push_back(w);
  CHECK(tail == std::vector<std::string>{"oop_p50", "oop_p95", "oop_slow", "oop_lag%", "ip_p50", "ip_p95", "ip_slow",
                                         "ip_lag%"});

  const auto rows = table_rows(run.report);
  REQUIRE(doc["results"].size() == 3);  // 1K, 8K, 64K
  REQUIRE(rows.size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    const Json& r = doc["results"][i];
    check_keys(r,
               {"size", "count", "type", "redop", "root", "out_of_place", "out_of_place_per_iter", "in_place",
                "in_place_per_iter", "actual_iterations", "experiment_name"},
               "results");
    CHECK(std::to_string(r["size"].get<size_t>()) == rows[i][0]);
    CHECK(std::to_string(r["count"].get<size_t>()) == rows[i][1]);
    CHECK(r["type"] == "float");
    CHECK(r["redop"] == "sum");
    CHECK(r["root"] == "    -1");  // the table's %6i, as nccl-tests writes it
    CHECK(r["actual_iterations"] == 4);
    CHECK(r["experiment_name"] == "");
    check_placement(r["out_of_place"], true);
    check_placement(r["in_place"], true);
    check_per_iteration(r["out_of_place_per_iter"], 4, 3, 1);
    check_per_iteration(r["in_place_per_iter"], 4, 3, 1);
  }
  check_keys(doc["out_of_bounds"], {"count", "okay"}, "out_of_bounds");
  CHECK(doc["out_of_bounds"]["count"] == 0);
  CHECK(doc["out_of_bounds"]["okay"] == "true");
  CHECK(doc["average_bus_bandwidth"]["bandwidth"].is_number());
  CHECK(doc["average_bus_bandwidth"]["okay"] == "unchecked");
  CHECK(doc["errors"].empty());

  // The CSV: the same rows, the transport actually used.
  std::istringstream lines(read_file(csv));
  std::string header, line;
  std::getline(lines, header);
  CHECK(header.rfind("collective,backend,transport,algo,world,bytes,count,type,redop,root,oop_time_us,", 0) == 0);
  int n = 0;
  while (std::getline(lines, line)) {
    CHECK(line.rfind("all_reduce,host,shm,auto,3," + rows[size_t(n)][0] + ",", 0) == 0);
    ++n;
  }
  CHECK(n == 3);

  // nccl-tests' own analysis script reads the file and finds it consistent.
  const std::string analyzer = nccl_tests_analyzer();
  if (analyzer.empty() || std::system("python3 --version >/dev/null 2>&1") != 0) {
    MESSAGE("nccl-tests' tools/analyze_perf_json.py not found (set NCCL_TESTS_DIR to a copy of nccl-tests): not run");
  } else {
    auto analysis = finish_child(spawn_program({"/usr/bin/env", "python3", analyzer, json, "--all"}),
                                 std::chrono::seconds(60));
    CHECK_MESSAGE(analysis.ok(), analysis.describe());
    CHECK(analysis.report.find("Consistency (times_us == max over process rows, OOP): PASS") != std::string::npos);
    CHECK(analysis.report.find("PER-PROCESS STRAGGLER ANALYSIS") != std::string::npos);
  }
}

TEST_CASE(
    "-J: a placement that did not run is null, an unchecked #wrong is null, a file is never overwritten and the "
    "new name is said") {
  if (!built("broadcast_perf")) {
    TINYDDP_SKIP("build broadcast_perf first");
  }
  TempDir dir;
  const std::string json = dir.file("bcast.json");
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto run = run_perf("broadcast_perf", 1, {"-b", "64", "-e", "64", "-n", "2", "-c", "0", "-J", json});
    REQUIRE_MESSAGE(run.ok(), run.describe());
    // The second run says, on stderr as well as in the table's header, where its JSON went instead.
    const std::string moved = "broadcast_perf: -J " + json + ": that file exists, so this run writes " + json +
                              ".0 (as nccl-tests does, -J never overwrites); hint: remove " + json;
    CHECK_MESSAGE((run.report.find(moved) != std::string::npos) == (attempt == 1), run.report);
    CHECK(run.report.find("# Writing JSON output to " + json + (attempt ? ".0\n" : "\n")) != std::string::npos);
  }
  const Json first = Json::parse(read_file(json));
  const Json second = Json::parse(read_file(json + ".0"));  // nccl-tests' rule: FILE, then FILE.0, FILE.1, ...
  for (const Json& doc : {first, second}) {
    REQUIRE(doc["results"].size() == 1);
    CHECK(doc["results"][0]["out_of_place"].is_null());
    check_placement(doc["results"][0]["in_place"], false);
    CHECK(doc["config"]["validation"] == 0);
    CHECK(doc["config"].contains("step_bytes"));  // no -f: nccl-tests writes the step in bytes
  }
}
