// Skips decided while a test runs (no device, a program not built, a tool missing): a test case that
// returns early would otherwise count as passed, and doctest has no run-time skip of its own.
//
//   TINYDDP_SKIP("no CUDA device: ", why);        // says why, records it, returns from the test case
//   TINYDDP_SKIP_PART("TINYDDP_LOG_LEVEL hides warnings: the logged reasons are not checked");
//                                                 // the same for some checks; the test case goes on
//
// doctest_main.cpp names every skip of the run at its end, and appends them to the file named by
// TINYDDP_SKIP_LOG (make test prints that file). A condition known before the run (a build option)
// is better a `* doctest::skip(true)` decorator, which doctest counts itself.
#pragma once

#include <doctest/doctest.h>

#include <sstream>
#include <string>

namespace tinyddp::testing {

// Notes a skip in the running test case: `whole` when the test case returns, else only a part of it.
void record_skip(const std::string& reason, bool whole);

template <typename... Parts>
std::string skip_reason(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

}  // namespace tinyddp::testing

// For a helper that returns a value its test case then returns on (a "program is built" check): says
// why and records the whole test case as skipped, without returning itself.
#define TINYDDP_RECORD_SKIP(...)                                                          \
  do {                                                                                    \
    const std::string tinyddp_skip_reason = ::tinyddp::testing::skip_reason(__VA_ARGS__); \
    MESSAGE("skipped: ", tinyddp_skip_reason);                                            \
    ::tinyddp::testing::record_skip(tinyddp_skip_reason, true);                           \
  } while (0)

// Says why, records the skip and returns from the test case.
#define TINYDDP_SKIP(...)             \
  do {                                \
    TINYDDP_RECORD_SKIP(__VA_ARGS__); \
    return;                           \
  } while (0)

#define TINYDDP_SKIP_PART(...)                                                            \
  do {                                                                                    \
    const std::string tinyddp_skip_reason = ::tinyddp::testing::skip_reason(__VA_ARGS__); \
    MESSAGE("skipped some checks: ", tinyddp_skip_reason);                                \
    ::tinyddp::testing::record_skip(tinyddp_skip_reason, false);                          \
  } while (0)
