#include "tinyddp/comm/flight_recorder.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "tinyddp/comm/reduce_op.h"
#include "tinyddp/core/env.h"
#include "tinyddp/core/log.h"

namespace tinyddp::comm {

namespace {

std::atomic<uint64_t> g_dump_requests{0};

void on_dump_signal(int) { g_dump_requests.fetch_add(1, std::memory_order_relaxed); }

// A steady-clock instant as Unix milliseconds (null when it never happened).
nlohmann::json unix_ms(FlightRecorder::Clock::time_point t) {
  if (t == FlightRecorder::Clock::time_point{}) return nullptr;
  auto ago = FlightRecorder::Clock::now() - t;
  auto wall = std::chrono::system_clock::now() - std::chrono::duration_cast<std::chrono::system_clock::duration>(ago);
  return std::chrono::duration_cast<std::chrono::milliseconds>(wall.time_since_epoch()).count();
}

std::string host_name() {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  return host;
}

nlohmann::json entry_json(const FlightRecorder::Entry& e) {
  const Fingerprint& f = e.fingerprint;
  nlohmann::json j;
  j["sequence"] = f.sequence;
  j["op"] = collective_kind_name(CollectiveKind(f.kind));
  j["dtype"] = dtype_name(DType(f.dtype));
  j["count"] = f.count;
  j["bytes"] = f.count * int64_t(dtype_size(DType(f.dtype)));
  if (f.reduces) j["reduce_op"] = reduce_op_name(ReduceOp(f.op));
  if (f.root >= 0) j["root"] = f.root;
  j["bucket"] = e.bucket >= 0 ? nlohmann::json(e.bucket) : nlohmann::json(nullptr);
  j["state"] = flight_state_name(e.state);
  j["queued_unix_ms"] = unix_ms(e.queued_at);
  j["started_unix_ms"] = unix_ms(e.started_at);
  j["finished_unix_ms"] = unix_ms(e.finished_at);
  return j;
}

}  // namespace

const char* flight_state_name(FlightRecorder::State state) {
  switch (state) {
    case FlightRecorder::State::queued: return "queued";
    case FlightRecorder::State::started: return "started";
    case FlightRecorder::State::finished: return "finished";
    case FlightRecorder::State::failed: return "failed";
  }
  return "?";
}

FlightRecorder::FlightRecorder(int rank, int world_size, std::string group, size_t capacity)
    : rank_(rank),
      world_size_(world_size),
      group_(std::move(group)),
      restart_count_(env::restart_count()),
      ring_(std::max<size_t>(capacity, 1)) {}

FlightRecorder::Entry* FlightRecorder::find(uint64_t sequence) {
  if (!any_ || sequence < oldest_ || sequence >= next_) return nullptr;
  return &ring_[sequence % ring_.size()];
}

void FlightRecorder::add(const Entry& entry) {
  const uint64_t sequence = entry.fingerprint.sequence;
  if (!any_) oldest_ = sequence;
  any_ = true;
  next_ = std::max(next_, sequence + 1);
  if (next_ - oldest_ > ring_.size()) oldest_ = next_ - ring_.size();
  ring_[sequence % ring_.size()] = entry;
}

void FlightRecorder::queued(const Fingerprint& fingerprint, int bucket, Clock::time_point at) {
  std::lock_guard<std::mutex> lock(mutex_);
  add(Entry{fingerprint, bucket, State::queued, at, {}, {}});
}

void FlightRecorder::queued_and_started(const Fingerprint& fingerprint, int bucket, Clock::time_point at) {
  std::lock_guard<std::mutex> lock(mutex_);
  add(Entry{fingerprint, bucket, State::started, at, at, {}});
  last_started_ = int64_t(fingerprint.sequence);
}

void FlightRecorder::started(uint64_t sequence, Clock::time_point at) {
  std::lock_guard<std::mutex> lock(mutex_);
  last_started_ = int64_t(sequence);
  if (Entry* e = find(sequence)) e->state = State::started, e->started_at = at;
}

void FlightRecorder::finished(uint64_t sequence, bool succeeded) {
  std::lock_guard<std::mutex> lock(mutex_);
  (succeeded ? last_finished_ : last_failed_) = int64_t(sequence);
  Entry* e = find(sequence);
  if (!e) return;
  e->state = succeeded ? State::finished : State::failed;
  e->finished_at = Clock::now();
  totals_.collectives += 1;
  if (e->started_at != Clock::time_point{})
    totals_.seconds += std::chrono::duration<double>(e->finished_at - e->started_at).count();
}

FlightRecorder::Totals FlightRecorder::totals() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return totals_;
}

void FlightRecorder::set_error(const std::string& message) {
  std::lock_guard<std::mutex> lock(mutex_);
  error_ = message;
}

FlightRecorder::Position FlightRecorder::position() const {
  std::lock_guard<std::mutex> lock(mutex_);
  Position p;
  auto* self = const_cast<FlightRecorder*>(this);
  const int64_t last_ended = std::max(last_finished_, last_failed_);
  if (last_started_ > last_ended)
    if (Entry* e = self->find(uint64_t(last_started_))) p.running = *e;
  if (last_ended >= 0)
    if (Entry* e = self->find(uint64_t(last_ended))) p.last_finished = *e;
  p.last_queued = any_ ? int64_t(next_) - 1 : -1;
  return p;
}

std::string FlightRecorder::describe(const Entry& e) {
  const Fingerprint& f = e.fingerprint;
  char size[32];
  const double bytes = double(f.count) * double(dtype_size(DType(f.dtype)));
  if (bytes < 1024)
    std::snprintf(size, sizeof size, "%.0f B", bytes);
  else if (bytes < 1024 * 1024)
    std::snprintf(size, sizeof size, "%.1f KiB", bytes / 1024);
  else
    std::snprintf(size, sizeof size, "%.1f MiB", bytes / (1024 * 1024));
  std::string text = std::string(collective_kind_name(CollectiveKind(f.kind))) + " #" + std::to_string(f.sequence) +
                     " (" + dtype_name(DType(f.dtype)) + " x" + std::to_string(f.count) + ", " + size;
  if (e.bucket >= 0) text += ", bucket " + std::to_string(e.bucket);
  return text + ")";
}

std::string FlightRecorder::describe(uint64_t sequence) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const Entry* e = const_cast<FlightRecorder*>(this)->find(sequence);
  return e ? describe(*e) : "";
}

std::vector<FlightRecorder::Entry> FlightRecorder::entries() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Entry> out;
  if (!any_) return out;
  for (uint64_t s = oldest_; s < next_; ++s) out.push_back(ring_[s % ring_.size()]);
  return out;
}

std::string FlightRecorder::to_json(const std::string& reason) const {
  nlohmann::json j;
  j["rank"] = rank_;
  j["world_size"] = world_size_;
  j["group"] = group_;
  j["host"] = host_name();
  j["pid"] = int(getpid());
  j["restart_count"] = restart_count_;
  j["reason"] = reason;
  j["written_unix_ms"] = unix_ms(Clock::now());
  Position p = position();
  j["last_queued"] = p.last_queued;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    j["last_started"] = last_started_;
    j["last_finished"] = last_finished_;
    j["error"] = error_;
  }
  j["entries"] = nlohmann::json::array();
  for (const Entry& e : entries()) j["entries"].push_back(entry_json(e));
  return j.dump(1);
}

std::string FlightRecorder::directory() { return env::text("TINYDDP_FLIGHT_RECORDER").value_or(""); }

size_t FlightRecorder::capacity_from_environment() {
  return size_t(env::unsigned_integer("TINYDDP_FLIGHT_RECORDER_ENTRIES", 1, 1 << 20).value_or(kDefaultCapacity));
}

std::string FlightRecorder::dump(const std::string& reason) const {
  const std::string dir = directory();
  if (dir.empty()) return "";
  const std::string name = "rank-" + std::to_string(rank_) + (group_ == "default" ? "" : "." + group_) + ".json";
  const std::string path = dir + "/" + name;
  const std::string temporary = path + ".tmp" + std::to_string(getpid());
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << to_json(reason) << "\n";
    if (!out.flush()) {
      log_line(LogLevel::warn, "flight recorder",
               "cannot write " + temporary + "; hint: TINYDDP_FLIGHT_RECORDER must name a writable directory");
      return "";
    }
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    std::remove(temporary.c_str());
    return "";
  }
  return path;
}

void FlightRecorder::install_dump_signal() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction action {};
    action.sa_handler = on_dump_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &action, nullptr);
  });
}

uint64_t FlightRecorder::dump_requests() { return g_dump_requests.load(std::memory_order_relaxed); }

}  // namespace tinyddp::comm
