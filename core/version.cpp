#include "tinyddp/core/version.h"

#include <cstdio>
#include <string>

// CMakeLists.txt defines it for this one file, so a version bump rebuilds nothing else.
#ifndef TINYDDP_VERSION_TEXT
#error "TINYDDP_VERSION_TEXT is set by CMakeLists.txt for core/version.cpp"
#endif

namespace tinyddp {

const char* version() { return TINYDDP_VERSION_TEXT; }

std::optional<int> answer_without_flags(int argc, char** argv, const char* about) {
  if (argc < 2) return std::nullopt;
  std::string program = argv[0];
  program = program.substr(program.find_last_of('/') + 1);
  const std::string arg = argv[1];
  if (arg == "--help" || arg == "-h") {
    std::printf(
        "%s\n\n%s takes no flags but these:\n  -h, --help  print this and exit\n  --version   print the version and "
        "exit\n",
        about, program.c_str());
    return 0;
  }
  if (arg == "--version") {
    std::printf("%s (tinyddp %s)\n", program.c_str(), version());
    return 0;
  }
  std::fprintf(stderr, "%s: %s %s; hint: it takes no flags (run %s --help)\n", program.c_str(),
               arg.starts_with("-") ? "unknown flag" : "unexpected argument", arg.c_str(), program.c_str());
  return 2;
}

}  // namespace tinyddp
