#include "tinyddp/comm/launch/flight_explain.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tinyddp/core/error.h"

namespace tinyddp::comm {

namespace {

std::string rank_list(const std::vector<int>& ranks) {
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) text += (i ? ", " : "") + std::to_string(ranks[i]);
  return text;
}

// "all_reduce #13 (f32 x1048576, 4194304 bytes, bucket 2)"
std::string describe_entry(const nlohmann::json& e) {
  std::ostringstream out;
  out << e.value("op", "?") << " #" << e.value("sequence", int64_t(-1)) << " (" << e.value("dtype", "?") << " x"
      << e.value("count", int64_t(0)) << ", " << e.value("bytes", int64_t(0)) << " bytes";
  if (e.contains("bucket") && e["bucket"].is_number()) out << ", bucket " << e["bucket"].get<int>();
  out << ")";
  return out.str();
}

RankFlightRecord read_record(const std::filesystem::path& path) {
  std::ifstream in(path);
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    TINYDDP_FAIL("flight record ", path.string(), " is not valid JSON (", e.what(), ")",
                 hint("it may be a partial file from another tool; remove it and read the others"));
  }
  RankFlightRecord r;
  r.present = true;
  r.rank = j.value("rank", -1);
  r.host = j.value("host", "");
  r.pid = j.value("pid", 0);
  r.world_size = j.value("world_size", 0);
  r.restart_count = j.value("restart_count", 0);
  r.reason = j.value("reason", "");
  r.error = j.value("error", "");
  r.group = j.value("group", "default");
  r.last_queued = j.value("last_queued", int64_t(-1));
  r.last_started = j.value("last_started", int64_t(-1));
  r.last_finished = j.value("last_finished", int64_t(-1));
  for (const auto& e : j.value("entries", nlohmann::json::array()))
    if (e.value("sequence", int64_t(-2)) == r.last_started) r.last_started_op = describe_entry(e);
  return r;
}

void judge(FlightExplanation& x) {
  bool others_waited = false;
  for (const auto& r : x.ranks) {
    if (!r.present) continue;
    if (r.last_started > x.furthest) x.furthest = r.last_started, x.furthest_op = r.last_started_op;
    others_waited = others_waited || r.reason == "timeout" || r.reason == "SIGUSR1";
  }
  for (const auto& r : x.ranks) {
    if (r.present && r.last_started == x.furthest && r.last_finished < x.furthest) x.waiting.push_back(r.rank);
    if ((r.present && r.last_started < x.furthest) || (!r.present && others_waited)) x.lagging.push_back(r.rank);
  }
  if (x.furthest_op.empty()) x.furthest_op = "collective #" + std::to_string(x.furthest);
  if (x.lagging.empty()) {
    x.verdict = x.waiting.empty() ? "no rank lags: every rank finished #" + std::to_string(x.furthest)
                                  : "no rank lags: every rank entered " + x.furthest_op +
                                        " (a transfer that stalled, or a rank that called another collective)";
    return;
  }
  std::string details;
  for (int lag : x.lagging) {
    const RankFlightRecord& r = x.ranks[size_t(lag)];
    std::string why = !r.present ? "it left no record (stopped, killed, or never ran a collective)"
                      : r.last_started > r.last_finished
                          ? "it is still in #" + std::to_string(r.last_started) + " (" + r.last_started_op + ")"
                          : "its last collective is #" + std::to_string(r.last_finished) + ", finished";
    details += (details.empty() ? "" : "; ") + std::string("rank ") + std::to_string(lag) +
               (r.present ? " (" + r.host + ", pid " + std::to_string(r.pid) + ")" : "") + ": " + why;
  }
  x.verdict = rank_list(x.lagging) + (x.lagging.size() == 1 ? " lags" : " lag") + ", not in " + x.furthest_op;
  if (!x.waiting.empty())
    x.verdict += " which " + rank_list(x.waiting) + (x.waiting.size() == 1 ? " waits" : " wait") + " in";
  x.verdict += ": " + details;
}

}  // namespace

FlightExplanation explain_flight_records(const std::string& dir, const std::string& group) {
  std::error_code ec;
  TINYDDP_CHECK(std::filesystem::is_directory(dir, ec), "--explain ", dir, ": no such directory",
                hint("give the directory TINYDDP_FLIGHT_RECORDER named"));
  std::vector<RankFlightRecord> found;
  const std::string suffix = group == "default" ? ".json" : "." + group + ".json";
  for (const auto& file : std::filesystem::directory_iterator(dir)) {
    const std::string name = file.path().filename().string();
    if (name.rfind("rank-", 0) != 0 || name.size() <= suffix.size() ||
        name.substr(name.size() - suffix.size()) != suffix)
      continue;
    if (group == "default" && name.find('.') != name.size() - 5) continue;  // another group's file
    found.push_back(read_record(file.path()));
  }
  TINYDDP_CHECK(
      !found.empty(), "--explain ", dir, ": no flight records (rank-<r>.json) there",
      hint("records are "
           "written on a collective's failure or on SIGUSR1, when TINYDDP_FLIGHT_RECORDER names this directory"));
  FlightExplanation x;
  for (const auto& r : found) x.restart_count = std::max(x.restart_count, r.restart_count);
  std::erase_if(found, [&x](const RankFlightRecord& r) {
    if (r.restart_count == x.restart_count) return false;
    x.earlier_records += 1;
    return true;
  });
  for (const auto& r : found) x.world_size = std::max({x.world_size, r.rank + 1, r.world_size});
  x.ranks.resize(size_t(x.world_size));
  for (int r = 0; r < x.world_size; ++r) x.ranks[size_t(r)].rank = r;
  for (const auto& r : found)
    if (r.rank >= 0 && r.rank < x.world_size) x.ranks[size_t(r.rank)] = r;
  judge(x);
  return x;
}

std::string format_explanation(const FlightExplanation& x) {
  std::ostringstream out;
  out << std::left << std::setw(6) << "rank" << std::setw(16) << "host" << std::setw(9) << "pid" << std::setw(13)
      << "last queued" << std::setw(14) << "last started" << std::setw(15) << "last finished"
      << "written because\n";
  auto num = [](int64_t v) { return v < 0 ? std::string("-") : std::to_string(v); };
  for (const auto& r : x.ranks) {
    out << std::setw(6) << r.rank;
    if (!r.present) {
      out << std::setw(16) << "-" << std::setw(9) << "-" << std::setw(13) << "-" << std::setw(14) << "-"
          << std::setw(15) << "-"
          << "(no record)\n";
      continue;
    }
    out << std::setw(16) << r.host << std::setw(9) << r.pid << std::setw(13) << num(r.last_queued) << std::setw(14)
        << num(r.last_started) << std::setw(15) << num(r.last_finished) << r.reason << "\n";
  }
  if (x.earlier_records > 0)
    out << "(" << x.earlier_records << " record" << (x.earlier_records > 1 ? "s" : "")
        << " of earlier attempts left out: these are restart " << x.restart_count << "'s)\n";
  out << "verdict: " << x.verdict << "\n";
  return out.str();
}

}  // namespace tinyddp::comm
