#include "tinyddp/comm/timeout.h"

#include <cstdio>

#include "tinyddp/core/env.h"

namespace tinyddp::comm {

std::chrono::milliseconds timeout_from_environment() {
  return env::seconds("TINYDDP_TIMEOUT").value_or(kDefaultTimeout);
}

std::chrono::milliseconds progress_interval() {
  return env::seconds("TINYDDP_PROGRESS_SECONDS").value_or(kDefaultProgressInterval);
}

std::string seconds_text(std::chrono::nanoseconds duration) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f s", std::chrono::duration<double>(duration).count());
  return text;
}

std::string timeout_hint(std::chrono::milliseconds timeout) {
  return "the timeout is " + seconds_text(timeout) +
         " (TINYDDP_TIMEOUT=<seconds>, the examples' --timeout, or the timeout in ProcessGroupOptions / "
         "RendezvousOptions set it)";
}

}  // namespace tinyddp::comm
