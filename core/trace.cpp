#include "tinyddp/core/trace.h"

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <vector>

#include "tinyddp/core/env.h"
#include "tinyddp/core/error.h"
#include "tinyddp/core/output_path.h"

namespace tinyddp::trace {

namespace {
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Recorder {
  std::mutex mutex;
  std::atomic<bool> on{false};
  std::string path;
  int rank = 0;
  // Timestamps are taken from the system clock so that the ranks' files line up when merged.
  int64_t epoch_us = 0;
  std::vector<json> events;
};

Recorder& recorder() {
  static Recorder r;
  return r;
}

int64_t wall_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// TINYDDP_TRACE turns tracing on at first use, with the rank from the launcher's RANK variable. A
// path that cannot be written throws here, at the first use (the Trainer's first step, or the Trace
// add-on's start), and again at every later use until it is fixed: never after the run.
void start_from_environment_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (std::optional<std::string> path = env::text("TINYDDP_TRACE")) {
      check_output_path("TINYDDP_TRACE", *path);
      start(*path, int(env::unsigned_integer("RANK", 0, 1 << 24).value_or(0)));
    }
  });
}

const char* lane_name(Lane lane) {
  switch (lane) {
    case Lane::compute: return "compute";
    case Lane::comm: return "communication";
    case Lane::data: return "data loading";
    case Lane::host: return "host";
  }
  return "other";
}
}  // namespace

bool enabled() {
  start_from_environment_once();
  return recorder().on.load(std::memory_order_relaxed);
}

void start(const std::string& path, int rank) {
  check_output_path("the trace file", path);
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.path = path;
  r.rank = rank;
  r.epoch_us = 0;  // absolute wall-clock microseconds: ranks on one host share the clock
  r.events.clear();
  r.on = true;
}

void set_rank(int rank) {
  std::lock_guard<std::mutex> lock(recorder().mutex);
  recorder().rank = rank;
}

std::string path() {
  std::lock_guard<std::mutex> lock(recorder().mutex);
  return recorder().on ? recorder().path : std::string();
}

int64_t now_us() { return wall_us() - recorder().epoch_us; }

void record_span(const std::string& name, const char* category, Lane lane, int64_t begin_us, int64_t end_us,
                 const std::string& args_json) {
  if (!enabled()) return;
  Recorder& r = recorder();
  json e = {{"name", name},   {"cat", category},          {"ph", "X"},
            {"ts", begin_us}, {"dur", end_us - begin_us}, {"tid", int(lane)}};
  if (!args_json.empty()) e["args"] = json::parse(args_json, nullptr, false);
  std::lock_guard<std::mutex> lock(r.mutex);
  e["pid"] = r.rank;
  r.events.push_back(std::move(e));
}

void record_instant(const std::string& name, const char* category, Lane lane, const std::string& args_json) {
  if (!enabled()) return;
  Recorder& r = recorder();
  json e = {{"name", name}, {"cat", category}, {"ph", "i"}, {"s", "t"}, {"ts", now_us()}, {"tid", int(lane)}};
  if (!args_json.empty()) e["args"] = json::parse(args_json, nullptr, false);
  std::lock_guard<std::mutex> lock(r.mutex);
  e["pid"] = r.rank;
  r.events.push_back(std::move(e));
}

std::string flush() {
  if (!enabled()) return "";
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  json events = json::array();
  events.push_back(
      {{"name", "process_name"}, {"ph", "M"}, {"pid", r.rank}, {"args", {{"name", "rank " + std::to_string(r.rank)}}}});
  for (Lane lane : {Lane::compute, Lane::comm, Lane::data, Lane::host})
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", r.rank},
                      {"tid", int(lane)},
                      {"args", {{"name", lane_name(lane)}}}});
  for (const json& e : r.events) events.push_back(e);
  std::string file = r.path + ".rank" + std::to_string(r.rank);
  std::ofstream out(file);
  TINYDDP_CHECK(out.good(), "cannot write the trace file ", file,
                hint("check that TINYDDP_TRACE names a writable path"));
  out << json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump();
  return file;
}

std::string merge(const std::string& path, int world) {
  json merged = json::array();
  std::vector<std::string> parts;
  for (int rank = 0; rank < world; ++rank) {
    std::string part_path = path + ".rank" + std::to_string(rank);
    std::ifstream in(part_path);
    if (!in.good()) continue;  // a rank that died before flushing: show the others
    parts.push_back(part_path);
    json part = json::parse(in, nullptr, false);
    if (part.is_discarded() || !part.contains("traceEvents")) continue;
    for (json& e : part["traceEvents"]) merged.push_back(std::move(e));
  }
  const std::string text = json{{"traceEvents", merged}, {"displayTimeUnit", "ms"}}.dump();
  std::string written = write_with_fallback(path, [&](const std::string& file) {
    std::ofstream out(file);
    out << text;
    out.close();
    TINYDDP_CHECK(out.good(), "cannot write the trace file ", file,
                  hint("check that the directory exists and is writable"));
  });
  // The per-rank files were only the way there: the merged file holds every event.
  std::error_code ignored;
  for (const std::string& part : parts) std::filesystem::remove(part, ignored);
  return written;
}

}  // namespace tinyddp::trace
