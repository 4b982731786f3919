#include "tinyddp/core/log_rate_limiter.h"

#include <cstdio>
#include <utility>

namespace tinyddp {

LogRateLimiter::LogRateLimiter(LogSink sink, LogRateLimit limit) : sink_(std::move(sink)), limit_(limit) {
  if (limit_.burst < 1) limit_.burst = 1;
}

std::string LogRateLimiter::kind_of(const std::string& message) {
  std::string kind;
  kind.reserve(message.size());
  for (char c : message)
    if (c < '0' || c > '9') kind += c;
  return kind;
}

void LogRateLimiter::summarize(Kind& kind, Clock::time_point now) {
  if (kind.held_back > 0) {
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%.1f", std::chrono::duration<double>(now - kind.window_start).count());
    sink_(kind.level, std::to_string(kind.held_back) + " more line" + (kind.held_back == 1 ? "" : "s") +
                          " like this one in the last " + seconds + " s, not written (the last: " + kind.last + ")");
  }
  kind.window_start = now;
  kind.written = 0;
  kind.held_back = 0;
  kind.last.clear();
}

void LogRateLimiter::log(LogLevel level, const std::string& message) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto now = Clock::now();
  auto [it, fresh] = kinds_.try_emplace(kind_of(message));
  Kind& kind = it->second;
  if (fresh) kind.window_start = now;
  if (now - kind.window_start >= limit_.window) summarize(kind, now);
  if (kind.written < limit_.burst) {
    kind.written++;
    sink_(level, message);
    return;
  }
  kind.held_back++;
  kind.level = level;
  kind.last = message;
  suppressed_total_++;
}

void LogRateLimiter::flush(bool all) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto now = Clock::now();
  for (auto it = kinds_.begin(); it != kinds_.end();) {
    Kind& kind = it->second;
    bool ended = now - kind.window_start >= limit_.window;
    if (kind.held_back > 0 && (all || ended)) summarize(kind, now);
    // A kind that has been quiet for a whole window is forgotten, so the table stays small.
    if (ended && kind.written == 0 && kind.held_back == 0)
      it = kinds_.erase(it);
    else
      ++it;
  }
}

uint64_t LogRateLimiter::suppressed_total() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return suppressed_total_;
}

}  // namespace tinyddp
