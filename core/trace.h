// The trace recorder: a Chrome-trace / Perfetto timeline of what each rank did and when. (The
// Trainer's Trace add-on, nn/train/addons/trace.h, turns it on for a run; DDP's bucket timeline,
// nn/ddp/bucket_timeline.h, is what records the buckets on it.)
//
// Set TINYDDP_TRACE=run.json (or call trace::start) and every rank records spans: forward and backward
// per layer on the "compute" lane, each gradient bucket's all-reduce on the "comm" lane, the optimizer
// step, and instants such as "bucket 0 ready". At the end (trace::flush) rank r writes its events to
// run.json.rank<r> and rank 0 merges every rank's file into run.json (and removes them), one process row per rank,
// which opens in https://ui.perfetto.dev or chrome://tracing. That picture is how you *see* DDP overlap the all-reduce
// of one bucket with the backward pass of the layers before it.
//
// Recording is cheap when off: one relaxed atomic load per span.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace tinyddp::trace {

// Lanes are Chrome-trace thread ids inside the rank's process row.
enum class Lane : int { compute = 1, comm = 2, data = 3, host = 4 };

bool enabled();
// Starts recording into `path` for `rank` (TINYDDP_TRACE does this on first use with rank from RANK).
// Throws when no file can be written at `path` (its directory is missing or read-only): before the
// run, not after it.
void start(const std::string& path, int rank);
// Sets the rank recorded in events (call once the rank is known, e.g. after rendezvous).
void set_rank(int rank);
// Writes this rank's events to "<path>.rank<r>" and returns that file's name ("" when disabled).
std::string flush();
// Merges "<path>.rank0" ... "<path>.rank<world-1>" into "<path>" and removes them (rank 0 calls this
// after a barrier). When "<path>" cannot be written it writes output_path.h's fallback instead and says
// so; returns the file written.
std::string merge(const std::string& path, int world);
// The path recording goes to ("" when disabled).
std::string path();

// Microseconds since the trace started (the timestamps of events).
int64_t now_us();
void record_span(const std::string& name, const char* category, Lane lane, int64_t begin_us, int64_t end_us,
                 const std::string& args_json = "");
void record_instant(const std::string& name, const char* category, Lane lane, const std::string& args_json = "");

// Records a span from construction to destruction: `trace::Span span("backward 2.Linear", "compute");`
class Span {
 public:
  Span(std::string name, const char* category, Lane lane = Lane::compute)
      : name_(enabled() ? std::move(name) : std::string()),
        category_(category),
        lane_(lane),
        begin_(name_.empty() ? 0 : now_us()) {}
  ~Span() {
    if (!name_.empty()) record_span(name_, category_, lane_, begin_, now_us());
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  std::string name_;
  const char* category_;
  Lane lane_;
  int64_t begin_;
};

}  // namespace tinyddp::trace
