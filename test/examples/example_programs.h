// The built example programs, run as a user runs them: shared by the examples suite's files.
#pragma once

#include <doctest/doctest.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "test/comm/helpers/child_process.h"
#include "test/test_skip.h"

namespace tinyddp::testing {

inline std::string program(const std::string& name) { return std::string(TINYDDP_BIN_DIR) + "/" + name; }

inline bool have_programs(std::initializer_list<const char*> names) {
  for (const char* name : names)
    if (!std::filesystem::exists(program(name))) {
      TINYDDP_RECORD_SKIP(program(name), " is not built (configure with -DTINYDDP_EXAMPLES=ON and build it)");
      return false;
    }
  return true;
}

// Runs a program to its end (at most two minutes, then it is killed: its workers die with it), with
// stdout and stderr together.
inline ChildOutcome run(std::vector<std::string> argv, const std::vector<std::string>& env = {}) {
  argv[0] = program(argv[0]);
  ChildOutcome outcome = finish_child(spawn_program(argv, env), std::chrono::seconds(120));
  INFO(outcome.report);
  CHECK_MESSAGE(!outcome.timed_out, argv[0], " did not finish within 120 s");
  return outcome;
}

inline size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace tinyddp::testing
