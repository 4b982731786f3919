// core/env.h: typed environment variables, and the helpers the transports share (hash, process
// liveness) and TINYDDP_DEBUG's one parser.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>

#include "tinyddp/core/env.h"
#include "tinyddp/core/error.h"
#include "tinyddp/core/hash.h"
#include "tinyddp/core/log.h"
#include "tinyddp/core/process.h"
#include "test/test_support.h"

using namespace tinyddp;
using tinyddp::testing::ScopedEnv;

TEST_CASE("env: whole numbers in range, or an error naming the variable, the value and the range") {
  CHECK(env::parse_unsigned_integer("X", "0") == 0);
  CHECK(env::parse_unsigned_integer("X", "1048576", 4096) == 1048576);
  CHECK(env::parse_unsigned_integer("X", "18446744073709551615") == 18446744073709551615ull);
  for (const char* bad : {"", "1M", "-1", "+5", " 5", "5 ", "0x10", "1.5", "18446744073709551616"})
    CHECK_THROWS_WITH_AS(env::parse_unsigned_integer("TINYDDP_X", bad), doctest::Contains("TINYDDP_X='"), Error);
  CHECK_THROWS_WITH_AS(env::parse_unsigned_integer("TINYDDP_X", "4095", 4096, 8192),
                       doctest::Contains("TINYDDP_X='4095' is not a whole number from 4096 to 8192"), Error);
  CHECK_THROWS_WITH_AS(env::parse_unsigned_integer("TINYDDP_X", "8193", 4096, 8192),
                       doctest::Contains("unset TINYDDP_X"), Error);
}

TEST_CASE("env: seconds are a positive number, fractions allowed, in milliseconds rounded up") {
  CHECK(env::parse_seconds("TINYDDP_TIMEOUT", "30") == std::chrono::milliseconds(30000));
  CHECK(env::parse_seconds("TINYDDP_TIMEOUT", "2.5") == std::chrono::milliseconds(2500));
  CHECK(env::parse_seconds("TINYDDP_TIMEOUT", "30s") == std::chrono::milliseconds(30000));
  CHECK(env::parse_seconds("TINYDDP_TIMEOUT", "0.0001") == std::chrono::milliseconds(1));
  for (const char* bad : {"", "0", "-1", "5min", "1h", "abc", "nan", "inf", "1e9", " 3", "3 "})
    CHECK_THROWS_WITH_AS(env::parse_seconds("TINYDDP_TIMEOUT", bad),
                         doctest::Contains("' is not a number of seconds above 0 and at most"), Error);
  CHECK_THROWS_WITH_AS(env::parse_seconds("TINYDDP_TIMEOUT", "5m"), doctest::Contains("unset TINYDDP_TIMEOUT"), Error);
}

TEST_CASE("env: flags take the usual words in any case") {
  for (const char* yes : {"1", "true", "TRUE", "yes", "On"}) CHECK(env::parse_flag("X", yes));
  for (const char* no : {"0", "false", "No", "OFF"}) CHECK_FALSE(env::parse_flag("X", no));
  CHECK_THROWS_WITH_AS(env::parse_flag("TINYDDP_BIND_ALL", "maybe"),
                       doctest::Contains("TINYDDP_BIND_ALL='maybe' is neither on nor off"), Error);
}

TEST_CASE("env: a choice is one of its words, in any case; the error lists them all") {
  enum class Color { red, green, blue };
  auto parse = [](const char* text) {
    return env::parse_choice<Color>("COLOR", text,
                                    {{"red", Color::red}, {"green", Color::green}, {"blue", Color::blue}});
  };
  CHECK(parse("red") == Color::red);
  CHECK(parse("GREEN") == Color::green);
  CHECK(parse("Blue") == Color::blue);
  CHECK_THROWS_WITH_AS(parse("purple"), doctest::Contains("COLOR='purple' is not one of red, green or blue"), Error);
}

TEST_CASE("env: unset and empty mean not given; a set value is parsed") {
  {
    ScopedEnv unset("TINYDDP_TEST_ENV", nullptr);
    CHECK_FALSE(env::text("TINYDDP_TEST_ENV").has_value());
    CHECK(env::unsigned_integer("TINYDDP_TEST_ENV").value_or(7) == 7);
  }
  {
    ScopedEnv empty("TINYDDP_TEST_ENV", "");
    CHECK_FALSE(env::flag("TINYDDP_TEST_ENV").has_value());
  }
  {
    ScopedEnv set("TINYDDP_TEST_ENV", "65536");
    CHECK(env::unsigned_integer("TINYDDP_TEST_ENV") == 65536u);
    CHECK_THROWS_AS(env::flag("TINYDDP_TEST_ENV"), Error);
  }
}

TEST_CASE("TINYDDP_DEBUG: OFF, INFO or DETAIL in any case; unset is OFF; anything else is an error") {
  {
    ScopedEnv unset("TINYDDP_DEBUG", nullptr);
    CHECK(debug_level() == DebugLevel::off);
  }
  {
    ScopedEnv info("TINYDDP_DEBUG", "info");
    CHECK(debug_level() == DebugLevel::info);
  }
  {
    ScopedEnv detail("TINYDDP_DEBUG", "DETAIL");
    CHECK(debug_level() == DebugLevel::detail);
  }
  {
    ScopedEnv bad("TINYDDP_DEBUG", "verbose");
    CHECK_THROWS_WITH_AS(debug_level(), doctest::Contains("TINYDDP_DEBUG='verbose' is not one of OFF, INFO or DETAIL"),
                         Error);
  }
}

TEST_CASE("fnv1a: the published 64-bit FNV-1a values") {
  // Test vectors from the FNV reference (draft-eastlake-fnv): "" is the offset basis.
  CHECK(fnv1a("") == 0xcbf29ce484222325ull);
  CHECK(fnv1a("a") == 0xaf63dc4c8601ec8cull);
  CHECK(fnv1a("foobar") == 0x85944171f73967e8ull);
}

TEST_CASE("process_alive: a running child is alive; once it exits, even unreaped (a zombie), it is not") {
  CHECK(process_alive(::getpid()));
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    char go;
    ::close(ready[1]);
    (void)::read(ready[0], &go, 1);  // wait until the parent has looked at the live child
    ::_exit(0);
  }
  ::close(ready[0]);
  CHECK(process_alive(child));
  ::close(ready[1]);  // the child reads EOF and exits; unreaped, it stays a zombie
  for (int i = 0; i < 2000 && process_alive(child); ++i) ::usleep(1000);
  CHECK_FALSE(process_alive(child));
  int status = 0;
  ::waitpid(child, &status, 0);
  CHECK_FALSE(process_alive(child));
}
