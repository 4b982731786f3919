// How a program ends on a failure: an Error's text for users (its location only under TINYDDP_DEBUG),
// run_main's one message and exit code 1, and the same for an exception that nobody catches.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <thread>

#include "tinyddp/core/error.h"
#include "tinyddp/core/run_main.h"
#include "test/comm/helpers/child_process.h"
#include "test/test_support.h"

using namespace tinyddp;
using namespace tinyddp::testing;

namespace {

size_t occurrences(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

Error caught_error() {
  try {
    const int answer = 41;
    TINYDDP_CHECK(answer == 42, "the answer is ", answer, hint("add one"));
  } catch (const Error& e) {
    return e;
  }
  FAIL("TINYDDP_CHECK did not throw");
  throw std::logic_error("unreachable");
}

}  // namespace

TEST_CASE("Error: users read the message and its hint; the library's file and line only under TINYDDP_DEBUG") {
  {
    ScopedEnv off("TINYDDP_DEBUG", nullptr);
    const Error e = caught_error();
    CHECK(std::string(e.what()) == "tinyddp error: the answer is 41; hint: add one");
    CHECK(e.message() == "the answer is 41; hint: add one");
    // The two parts are fields of their own: nobody takes the text apart to find them.
    CHECK(e.problem() == "the answer is 41");
    CHECK(e.hint() == "add one");
    try {
      TINYDDP_FAIL("no advice here, ", 2, " parts; hint text in a message stays message");
    } catch (const Error& plain) {
      CHECK(plain.hint().empty());
      CHECK(plain.problem() == "no advice here, 2 parts; hint text in a message stays message");
      CHECK(plain.message() == plain.problem());
    }
    try {
      TINYDDP_FAIL("a hint in ", 2, " parts", hint("do ", 1, " thing"));
    } catch (const Error& split) {
      CHECK(split.problem() == "a hint in 2 parts");
      CHECK(split.hint() == "do 1 thing");
      CHECK(std::string(split.what()).starts_with("tinyddp error: a hint in 2 parts; hint: do 1 thing"));
    }
    // Always there for whoever asks.
    const std::string where = "test_run_main.cpp:" + std::to_string(e.line());
    CHECK(e.location().starts_with("check `answer == 42` failed at "));
    CHECK(e.location().ends_with(where));
  }
  {
    ScopedEnv explicit_off("TINYDDP_DEBUG", "off");
    CHECK(std::string(caught_error().what()).find("failed at") == std::string::npos);
  }
  for (const char* level : {"INFO", "detail"}) {
    ScopedEnv on("TINYDDP_DEBUG", level);
    const Error e = caught_error();
    CHECK(std::string(e.what()) == "tinyddp error: the answer is 41; hint: add one\n  " + e.location());
  }
  {
    // A value TINYDDP_DEBUG does not allow is refused elsewhere (core/log.h); making an error must not throw.
    ScopedEnv bad("TINYDDP_DEBUG", "verbose");
    CHECK(std::string(caught_error().what()).find("failed at") != std::string::npos);
  }
}

TEST_CASE("run_main: the body's exit code; a failure printed once with exit code 1") {
  ScopedEnv off("TINYDDP_DEBUG", nullptr);
  CHECK(run_main([] { return 7; }) == 7);
  CHECK(run_main([] {}) == 0);
  {
    CapturedStderr err;
    CHECK(run_main([]() -> int { TINYDDP_FAIL("the disk is full", hint("free some space")); }) == 1);
    CHECK(err.text() == "tinyddp error: the disk is full; hint: free some space\n");
  }
  {
    CapturedStderr err;
    CHECK(run_main([] { throw std::out_of_range("map::at"); }) == 1);
    CHECK(err.text() == "error: map::at\n");
  }
  {
    CapturedStderr err;
    CHECK(run_main([] { throw 42; }) == 1);
    CHECK(occurrences(err.text(), "error: ") == 1);
  }
}

TEST_CASE(
    "exit_on_uncaught_exception: an exception nobody catches ends the process with its message and exit 1, no abort") {
  TINYDDP_SKIP_UNDER_TSAN();
  TempDir dir;
  const std::string log = dir.file("stderr");
  ChildOutcome out = finish_child(spawn_child([&](std::string&) {
                                    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
                                    ::dup2(fd, 2);
                                    ::unsetenv("TINYDDP_DEBUG");
                                    exit_on_uncaught_exception();
                                    exit_on_uncaught_exception();  // once is what counts
                                    // A thread's function has no caller to catch for it: std::terminate.
                                    std::thread([] { TINYDDP_FAIL("nobody catches this", hint("none")); }).join();
                                    return 0;
                                  }),
                                  std::chrono::seconds(30));
  std::ifstream in(log);
  const std::string said((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  INFO("the child said: ", said);
  CHECK(out.signal == 0);
  CHECK(out.exit_code == 1);
  CHECK(said == "tinyddp error: nobody catches this; hint: none\n");
}
