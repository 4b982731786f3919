#include "tinyddp/core/trace.h"

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <vector>

#include "tinyddp/core/error.h"

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
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// TINYDDP_TRACE turns tracing on at first use, with the rank from the launcher's RANK variable.
void start_from_environment_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* path = std::getenv("TINYDDP_TRACE");
    if (path && *path) {
      const char* rank = std::getenv("RANK");
      start(path, rank ? std::atoi(rank) : 0);
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
  json e = {{"name", name}, {"cat", category}, {"ph", "X"}, {"ts", begin_us}, {"dur", end_us - begin_us}, {"tid", int(lane)}};
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
  events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", r.rank}, {"args", {{"name", "rank " + std::to_string(r.rank)}}}});
  for (Lane lane : {Lane::compute, Lane::comm, Lane::data, Lane::host})
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", r.rank}, {"tid", int(lane)}, {"args", {{"name", lane_name(lane)}}}});
  for (const json& e : r.events) events.push_back(e);
  std::string file = r.path + ".rank" + std::to_string(r.rank);
  std::ofstream out(file);
  TINYDDP_CHECK(out.good(), "cannot write the trace file ", file, "; hint: check that TINYDDP_TRACE names a writable path");
  out << json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump();
  return file;
}

void merge(const std::string& path, int world) {
  json merged = json::array();
  for (int rank = 0; rank < world; ++rank) {
    std::ifstream in(path + ".rank" + std::to_string(rank));
    if (!in.good()) continue;  // a rank that died before flushing: show the others
    json part = json::parse(in, nullptr, false);
    if (part.is_discarded() || !part.contains("traceEvents")) continue;
    for (json& e : part["traceEvents"]) merged.push_back(std::move(e));
  }
  std::ofstream out(path);
  TINYDDP_CHECK(out.good(), "cannot write the trace file ", path, "; hint: check that the directory exists and is writable");
  out << json{{"traceEvents", merged}, {"displayTimeUnit", "ms"}}.dump();
}

}  // namespace tinyddp::trace
