#include "tinyddp/core/log.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <mutex>
#include <string>

#include "tinyddp/core/env.h"

namespace tinyddp {

const char* log_level_name(LogLevel level) {
  switch (level) {
    case LogLevel::debug: return "debug";
    case LogLevel::info: return "info";
    case LogLevel::warn: return "warn";
    case LogLevel::error: return "error";
    case LogLevel::off: return "off";
  }
  return "?";
}

LogLevel log_threshold() {
  static const LogLevel threshold = [] {
    return env::choice<LogLevel>("TINYDDP_LOG_LEVEL", {{"debug", LogLevel::debug},
                                                       {"info", LogLevel::info},
                                                       {"warn", LogLevel::warn},
                                                       {"error", LogLevel::error},
                                                       {"off", LogLevel::off}})
        .value_or(LogLevel::info);
  }();
  return threshold;
}

DebugLevel debug_level() {
  return env::choice<DebugLevel>("TINYDDP_DEBUG",
                                 {{"OFF", DebugLevel::off}, {"INFO", DebugLevel::info}, {"DETAIL", DebugLevel::detail}})
      .value_or(DebugLevel::off);
}

void log_line(LogLevel level, std::string_view component, std::string_view message) {
  if (level < log_threshold()) return;
  using namespace std::chrono;
  auto now = system_clock::now();
  std::time_t seconds = system_clock::to_time_t(now);
  auto millis = duration_cast<milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm local{};
  localtime_r(&seconds, &local);
  char stamp[32];
  std::snprintf(stamp, sizeof stamp, "%02d:%02d:%02d.%03d", local.tm_hour, local.tm_min, local.tm_sec, int(millis));
  // Build the whole line first and write it with one call, so concurrent lines do not interleave.
  std::string line = std::string("[tinyddp ") + stamp + " " + log_level_name(level) + " " + std::string(component) +
                     "] " + std::string(message) + "\n";
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

LogSink stderr_log_sink(std::string component) {
  return [component = std::move(component)](LogLevel level, const std::string& message) {
    log_line(level, component, message);
  };
}

}  // namespace tinyddp
