// What every program does with its command line (core/command_line.h) and with its output paths
// (core/output_path.h): ranges named by flag, the exit codes, --version; paths refused before the
// work, and the fallback when writing fails after it.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "tinyddp/core/command_line.h"
#include "tinyddp/core/error.h"
#include "tinyddp/core/output_path.h"
#include "tinyddp/core/version.h"
#include "test/test_support.h"

using namespace tinyddp;

namespace {

// Parses `args` (after the program's name) into an app with --epochs >= 1 and --rate in [0, 1].
std::optional<int> parse(std::vector<std::string> args, int& epochs, double& rate) {
  CLI::App app{"test program", "prog"};
  app.add_option("--epochs", epochs)->check(command_line::at_least(1));
  app.add_option("--rate", rate)->check(command_line::between(0.0, 1.0));
  args.insert(args.begin(), "prog");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return command_line::parse(app, int(argv.size()), argv.data());
}

std::string failure_of(const std::function<void()>& body) {
  try {
    body();
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

}  // namespace

TEST_CASE("command_line: a value in range goes on; out of range or unknown is exit code 2; --version and --help 0") {
  int epochs = 0;
  double rate = 0;
  CHECK_FALSE(parse({"--epochs", "3", "--rate", "0.5"}, epochs, rate).has_value());
  CHECK(epochs == 3);
  CHECK(rate == 0.5);
  CHECK(parse({"--epochs", "0"}, epochs, rate) == 2);
  CHECK(parse({"--epochs", "x"}, epochs, rate) == 2);
  CHECK(parse({"--rate", "1.5"}, epochs, rate) == 2);
  CHECK(parse({"--bogus"}, epochs, rate) == 2);
  CHECK(parse({"--version"}, epochs, rate) == 0);
  CHECK(parse({"--help"}, epochs, rate) == 0);
}

TEST_CASE("command_line: the validators' messages name the range and the value given") {
  std::string text = "-1";
  CHECK(command_line::at_least(1)(text) == "must be >= 1, got -1");
  text = "2";
  CHECK(command_line::at_least(1)(text).empty());
  text = "0";
  CHECK(command_line::between(1, 65535)(text) == "must be from 1 to 65535, got 0");
  text = "0";
  CHECK(command_line::positive<double>()(text) == "must be > 0, got 0");
  text = "1e-3";
  CHECK(command_line::positive<double>()(text).empty());
  text = "0.25";
  CHECK(command_line::between(0.5, 1.0)(text) == "must be from 0.5 to 1, got 0.25");
}

TEST_CASE("version: the configured version, and the answer of a program without flags") {
  CHECK(std::string(version()).find('.') != std::string::npos);
  std::string name = "prog", help = "--help", version_flag = "--version", bogus = "--bogus";
  char* none[] = {name.data()};
  char* asks_help[] = {name.data(), help.data()};
  char* asks_version[] = {name.data(), version_flag.data()};
  char* wrong[] = {name.data(), bogus.data()};
  CHECK_FALSE(answer_without_flags(1, none, "about").has_value());
  CHECK(answer_without_flags(2, asks_help, "about") == 0);
  CHECK(answer_without_flags(2, asks_version, "about") == 0);
  CHECK(answer_without_flags(2, wrong, "about") == 2);
}

TEST_CASE("output paths: refused before the work when the directory is missing or the path is a directory") {
  testing::TempDir dir;
  CHECK_NOTHROW(check_output_path("--save", dir.file("model.safetensors")));
  CHECK(failure_of([&] { check_output_path("--save", dir.file("missing/model.safetensors")); })
            .find("--save " + dir.file("missing/model.safetensors") + ": the directory " + dir.file("missing") +
                  " does not exist; hint: create it first") != std::string::npos);
  CHECK(failure_of([&] { check_output_path("TINYDDP_TRACE", dir.path.string()); }).find(" is a directory") !=
        std::string::npos);
  CHECK(failure_of([&] { check_output_path("--save", ""); }).find("--save is empty") != std::string::npos);
  if (geteuid() != 0) {  // root writes anywhere
    std::filesystem::create_directory(dir.file("ro"));
    std::filesystem::permissions(dir.file("ro"),
                                 std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
    CHECK(failure_of([&] { check_output_path("--save", dir.file("ro/m")); }).find("is not writable") !=
          std::string::npos);
  }
}

TEST_CASE("output paths: when writing fails at the end, the data goes to the fallback and the path is returned") {
  testing::TempDir dir;
  CHECK(write_with_fallback(dir.file("a.txt"), [](const std::string& p) { std::ofstream(p) << "a"; }) ==
        dir.file("a.txt"));
  // The directory went away during the run: the fallback in TMPDIR gets the bytes.
  const std::string gone = dir.file("gone/model.txt");
  const char* tmpdir = std::getenv("TMPDIR");
  const std::string previous = tmpdir ? tmpdir : "";
  ::setenv("TMPDIR", dir.path.c_str(), 1);
  std::string written = write_with_fallback(gone, [](const std::string& p) {
    std::ofstream out(p);
    TINYDDP_CHECK(out.good(), "cannot open ", p);
    out << "weights";
  });
  if (previous.empty())
    ::unsetenv("TMPDIR");
  else
    ::setenv("TMPDIR", previous.c_str(), 1);
  CHECK(written == dir.file("model.txt." + std::to_string(getpid())));
  std::ifstream in(written);
  std::string content;
  in >> content;
  CHECK(content == "weights");
  // Both failing is an error naming both paths.
  std::string both = failure_of(
      [&] { write_with_fallback(gone, [](const std::string& p) { TINYDDP_FAIL("cannot open ", p); }); });
  CHECK(both.find("cannot write " + gone) != std::string::npos);
  CHECK(both.find("nor the fallback") != std::string::npos);
}
