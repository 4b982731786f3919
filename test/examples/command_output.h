// Runs a shell command and hands back what it printed (stdout and stderr) and its exit code: for the
// tests that check the tree with a script or a binary tool (check_layering.sh, convert_hints.py, nm).
#pragma once

#include <doctest/doctest.h>
#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace tinyddp::testing {

struct CommandOutput {
  int exit_code = -1;  // -1: ended by a signal
  std::string output;
};

inline CommandOutput command_output(const std::string& command) {
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  REQUIRE_MESSAGE(pipe != nullptr, "cannot run: ", command);
  CommandOutput run;
  char buffer[65536];
  for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;) run.output.append(buffer, n);
  const int status = ::pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

}  // namespace tinyddp::testing
