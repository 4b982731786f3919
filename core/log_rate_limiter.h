// LogRateLimiter: a LogSink in front of another that lets a burst of similar lines through and then
// counts the rest, so a flood of misbehaving clients costs the log a few lines, not thousands.
//
//   LogRateLimiter limited(stderr_log_sink("store"), {.burst = 5, .window = std::chrono::seconds(10)});
//   limited.log(LogLevel::warn, "closed 10.0.0.7:41234: sent no complete hello within 30000 ms");
//   ...  (the 6th to the 20 000th such line in 10 s are counted, not written)
//   limited.flush();   // "... 19 995 more lines like this one in the last 10.0 s (the last: closed 10.0.0.9:...)"
//
// Lines are "similar" when they are equal once their digits are taken out: the addresses, ports and
// numbers that differ from one offending client to the next do not make a line new. Each kind gets
// `burst` lines per window; what is held back is summed up in one line when its window ends (on the
// next line of that kind, or on flush(), which the owner calls every window and when it stops: the
// store server, comm/store/store_server.h, does).
// Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>

#include "tinyddp/core/log.h"

namespace tinyddp {

struct LogRateLimit {
  int burst = 5;  // lines of one kind written per window before the rest are only counted
  std::chrono::milliseconds window = std::chrono::seconds(10);
};

class LogRateLimiter {
 public:
  using Clock = std::chrono::steady_clock;

  LogRateLimiter(LogSink sink, LogRateLimit limit = {});

  void log(LogLevel level, const std::string& message);
  // Writes the summary of every kind whose window has ended with lines held back; with `all`, of
  // every kind that holds lines back at all (at the end).
  void flush(bool all = false);
  // Lines held back since the start (for tests and stats).
  uint64_t suppressed_total() const;

  // The kind a line belongs to: the line without its digits.
  static std::string kind_of(const std::string& message);

 private:
  struct Kind {
    Clock::time_point window_start;
    int written = 0;         // in this window
    uint64_t held_back = 0;  // in this window
    LogLevel level = LogLevel::info;
    std::string last;  // the last line held back, quoted in the summary
  };
  void summarize(Kind& kind, Clock::time_point now);

  LogSink sink_;
  LogRateLimit limit_;
  mutable std::mutex mutex_;
  std::unordered_map<std::string, Kind> kinds_;
  uint64_t suppressed_total_ = 0;
};

}  // namespace tinyddp
