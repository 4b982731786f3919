// Running the collective benchmark programs from tests: under the real tinyddp-run for several
// ranks, alone for one, and reading back the table they print.
#pragma once

#include <doctest/doctest.h>

#include <sstream>
#include <string>
#include <sys/stat.h>
#include <vector>

#include "test/comm/helpers/child_process.h"

namespace tinyddp::testing {

inline std::string bin_path(const std::string& program) { return std::string(TINYDDP_BIN_DIR) + "/" + program; }

inline bool built(const std::string& program) {
  struct stat st {};
  return ::stat(bin_path(program).c_str(), &st) == 0;
}

// Runs `program args...` on `world` ranks (tinyddp-run for more than one) and returns how it ended,
// with rank 0's output (the launcher's "[rank 0] " prefixes removed) as the report.
inline ChildOutcome run_perf(const std::string& program, int world, const std::vector<std::string>& args,
                             const std::vector<std::string>& env = {}) {
  std::vector<std::string> argv;
  if (world > 1) argv = {bin_path("tinyddp-run"), "-n", std::to_string(world)};
  argv.push_back(bin_path(program));
  argv.insert(argv.end(), args.begin(), args.end());
  ChildOutcome outcome = finish_child(spawn_program(argv, env), std::chrono::seconds(120));
  std::istringstream lines(outcome.report);
  std::string line, kept;
  while (std::getline(lines, line)) {
    const std::string prefix = "[rank 0] ";
    if (line.rfind("[rank ", 0) == 0 && line.rfind(prefix, 0) != 0) continue;  // another rank's line
    kept += (line.rfind(prefix, 0) == 0 ? line.substr(prefix.size()) : line) + "\n";
  }
  outcome.report = kept;
  return outcome;
}

// The table's rows, each split on white space: size count type redop root, then time algbw busbw
// #wrong out of place and in place.
inline std::vector<std::vector<std::string>> table_rows(const std::string& output) {
  std::vector<std::vector<std::string>> rows;
  std::istringstream lines(output);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    std::vector<std::string> row;
    for (std::string f; fields >> f;) row.push_back(f);
    if (!row.empty() && row[0].find_first_not_of("0123456789") == std::string::npos) rows.push_back(row);
  }
  return rows;
}

}  // namespace tinyddp::testing
