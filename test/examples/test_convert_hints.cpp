// scripts/convert_hints.py, which moved every TINYDDP_CHECK / TINYDDP_FAIL hint into hint(...): each
// form it rewrites, what it leaves alone, and that a second run changes nothing.
#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "test/examples/command_output.h"
#include "test/test_skip.h"

namespace {

std::string run(const std::string& command) { return tinyddp::testing::command_output(command).output; }

std::string read(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

TEST_CASE("convert_hints.py: each hint form becomes hint(...), the rest is left alone, and a rerun changes nothing") {
  if (std::system("python3 --version >/dev/null 2>&1 && git --version >/dev/null 2>&1") != 0) {
    TINYDDP_SKIP("python3 or git is missing");
  }
  const std::filesystem::path root = std::filesystem::temp_directory_path() /
                                     ("tinyddp-convert-hints-" + std::to_string(::getpid()));
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root / "core");
  const std::string before =
      "namespace tinyddp {\n"
      "void f() {\n"
      "  TINYDDP_CHECK(n > 0, \"writing \", path, \" failed; hint: check free disk space\");\n"
      "  TINYDDP_FAIL(\"program '\", name, \"' was not found; hint: give its path (./\", name, \")\");\n"
      "  TINYDDP_CHECK(a, \"x: \", y, \"; \"\n"
      "                \"hint: split across literals\");\n"
      "  TINYDDP_CHECK(a, \"x\", c ? \"; hint: one\" : \"; hint: other\");\n"
      "  TINYDDP_CHECK(strstr(s, \"; hint: \"), \"the condition is not a message\");\n"
      "  log(\"a log line; hint: stays text\");\n"
      "}\n"
      "}\n";
  const std::string after =
      "namespace tinyddp {\n"
      "void f() {\n"
      "  TINYDDP_CHECK(n > 0, \"writing \", path, \" failed\", hint(\"check free disk space\"));\n"
      "  TINYDDP_FAIL(\"program '\", name, \"' was not found\", hint(\"give its path (./\", name, \")\"));\n"
      "  TINYDDP_CHECK(a, \"x: \", y, hint(\"split across literals\"));\n"
      "  TINYDDP_CHECK(a, \"x\", hint(c ? \"one\" : \"other\"));\n"
      "  TINYDDP_CHECK(strstr(s, \"; hint: \"), \"the condition is not a message\");\n"
      "  log(\"a log line; hint: stays text\");\n"
      "}\n"
      "}\n";
  std::ofstream(root / "core/a.cpp") << before;
  // Outside namespace tinyddp the call is qualified.
  std::ofstream(root / "core/b.cpp") << "void g() { TINYDDP_FAIL(\"bad; hint: good\"); }\n";
  run("cd '" + root.string() + "' && git init -q && git add -A");
  const std::string script = std::string(TINYDDP_SOURCE_DIR) + "/scripts/convert_hints.py '" + root.string() + "'";
  const std::string first = run(script);
  CHECK(read(root / "core/a.cpp") == after);
  CHECK(read(root / "core/b.cpp") == "void g() { TINYDDP_FAIL(\"bad\", tinyddp::hint(\"good\")); }\n");
  CHECK_MESSAGE(first.find("changed 5 calls in 2 files") != std::string::npos, first);
  const std::string second = run(script);
  CHECK_MESSAGE(second.find("changed 0 calls in 0 files") != std::string::npos, second);
  CHECK(read(root / "core/a.cpp") == after);
  std::filesystem::remove_all(root);
}
