// CommandLine: what every tinyddp program does with its command line, so they all speak alike.
//
//   CLI::App app{"digits: an MLP on the handwritten digits"};
//   app.add_option("--epochs", epochs, "passes over the
//   data")->check(command_line::at_least(1))->capture_default_str(); if (auto code = command_line::parse(app, argc,
//   argv)) return *code;
//
// The exit codes are the same in every program (docs/reference.md, "Flags, exit codes and environment variables"):
//   0  done (--help and --version too)
//   1  the work started and failed (an error message on stderr names what and where)
//   2  the command line was wrong; nothing ran (the message names the flag)
// tinyddp-run passes on its failed worker's own code instead of 1, as torchrun does.
//
// A number out of range is named with the flag and the range ("--epochs: must be >= 1, got -1"), an
// unknown flag is named as one ("unknown flag --bogus"), and every message ends with where to look.
// Needs CLI11 (the tinyddp::cli target); the library itself never includes this header.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <sstream>
#include <string>

#include "tinyddp/core/version.h"

namespace tinyddp::command_line {

inline constexpr int kFailed = 1;
inline constexpr int kUsageError = 2;

// 1, 0.5, 1e-06: as short as the number allows (std::to_string writes 0.500000).
template <typename Number>
std::string number_text(Number value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

// A whole number (or a real one) no smaller than `min`: "must be >= 1, got -1".
template <typename Number>
CLI::Validator at_least(Number min) {
  return CLI::Validator(
      [min](std::string& text) -> std::string {
        Number value{};
        if (!CLI::detail::lexical_cast(text, value)) return "expected a number, got " + text;
        return value >= min ? std::string() : "must be >= " + number_text(min) + ", got " + text;
      },
      ">=" + number_text(min));
}

// A number above zero: "must be > 0, got 0".
template <typename Number>
CLI::Validator positive() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        Number value{};
        if (!CLI::detail::lexical_cast(text, value)) return "expected a number, got " + text;
        return value > Number(0) ? std::string() : "must be > 0, got " + text;
      },
      ">0");
}

// A number in [min, max]: "must be from 1 to 65535, got 0".
template <typename Number>
CLI::Validator between(Number min, Number max) {
  return CLI::Validator(
      [min, max](std::string& text) -> std::string {
        Number value{};
        if (!CLI::detail::lexical_cast(text, value)) return "expected a number, got " + text;
        return value >= min && value <= max
                   ? std::string()
                   : "must be from " + number_text(min) + " to " + number_text(max) + ", got " + text;
      },
      number_text(min) + ".." + number_text(max));
}

// Adds --version ("digits (tinyddp 0.1.0)"). parse() calls it; a program that parses by itself may too.
inline void add_version(CLI::App& app) {
  if (app.get_option_no_throw("--version") != nullptr) return;
  std::string program = app.get_name().empty() ? "tinyddp" : app.get_name();
  app.set_version_flag("--version", program + " (tinyddp " + version() + ")", "print the version and exit");
}

// Parses argv into `app`. Returns nothing when the program should go on; otherwise the code to exit
// with: 0 after --help or --version (printed on stdout), kUsageError after a mistake (printed on
// stderr, naming the flag, with a pointer to --help).
inline std::optional<int> parse(CLI::App& app, int argc, char** argv) {
  if (app.get_name().empty() && argc > 0) {
    std::string name = argv[0];
    app.name(name.substr(name.find_last_of('/') + 1));
  }
  add_version(app);
  try {
    app.parse(argc, argv);
    return std::nullopt;
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return 0;
  } catch (const CLI::CallForAllHelp&) {
    std::fputs(app.help("", CLI::AppFormatMode::All).c_str(), stdout);
    return 0;
  } catch (const CLI::CallForVersion& version) {
    std::printf("%s\n", version.what());
    return 0;
  } catch (const CLI::ExtrasError& e) {
    std::string extras;
    for (const std::string& arg : app.remaining()) extras += (extras.empty() ? "" : " ") + arg;
    bool flag = !extras.empty() && extras.front() == '-';
    std::fprintf(stderr, "%s: %s %s; hint: run %s --help for the flags it takes\n", app.get_name().c_str(),
                 flag ? "unknown flag" : "unexpected argument", extras.c_str(), app.get_name().c_str());
    return kUsageError;
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "%s: %s; hint: run %s --help for the flags and their ranges\n", app.get_name().c_str(),
                 e.what(), app.get_name().c_str());
    return kUsageError;
  }
}

// A mistake in the command line found after parsing (two flags that do not go together): the
// message, and the usage exit code.
inline int usage_error(const CLI::App& app, const std::string& message) {
  std::fprintf(stderr, "%s: %s; hint: run %s --help for the flags\n", app.get_name().c_str(), message.c_str(),
               app.get_name().c_str());
  return kUsageError;
}

}  // namespace tinyddp::command_line
