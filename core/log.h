// Log: one-line, timestamped messages on stderr for the long-running parts of the runtime (the store
// server, the launcher, DDP's bucket report), which have nobody to throw to when a client misbehaves.
//
//   [tinyddp 12:03:04.512 warn store] closed 127.0.0.1:51234: unknown command 0x7f; ...
//
// TINYDDP_LOG_LEVEL=debug|info|warn|error|off picks what is shown (default: info). Components that
// need their messages elsewhere (tests, the launcher's own output) take a LogSink instead.
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace tinyddp {

enum class LogLevel { debug = 0, info = 1, warn = 2, error = 3, off = 4 };

const char* log_level_name(LogLevel level);

// The level read once from TINYDDP_LOG_LEVEL.
LogLevel log_threshold();

// Writes one line to stderr when `level` passes the threshold. Thread-safe: lines never interleave.
void log_line(LogLevel level, std::string_view component, std::string_view message);

// TINYDDP_DEBUG=OFF|INFO|DETAIL, the levels of PyTorch's TORCH_DISTRIBUTED_DEBUG: how much the
// distributed runtime reports and checks. INFO: DDP logs its gradient buckets. DETAIL: that, and every
// collective first checks that all ranks called the same one (comm/fingerprint.h). Unset: OFF; any
// other value is an error naming the three.
enum class DebugLevel { off = 0, info = 1, detail = 2 };
DebugLevel debug_level();

// Where a component sends its messages. The default (stderr_log_sink) calls log_line.
using LogSink = std::function<void(LogLevel, const std::string&)>;
LogSink stderr_log_sink(std::string component);

}  // namespace tinyddp
