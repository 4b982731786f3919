#include "tinyddp/core/error.h"

#include <strings.h>

#include <cstdlib>

namespace tinyddp {

namespace {
// Paths are printed relative to the project root ("nn/linear.cpp", not "/home/.../nn/linear.cpp"),
// so messages read the same on every machine.
std::string project_relative(const std::string& file) {
  for (const char* top : {"/core/", "/kernels/", "/comm/", "/nn/", "/examples/", "/bench/", "/test/"}) {
    auto at = file.rfind(top);
    if (at != std::string::npos) return file.substr(at + 1);
  }
  return file;
}

std::string locate(const std::string& expression, const std::string& file, int line) {
  return (expression.empty() ? "raised at " : "check `" + expression + "` failed at ") + file + ":" +
         std::to_string(line);
}

// TINYDDP_DEBUG asks for the library's own details. Read here without core/log.h's parser, which
// throws an Error for a value it does not know: an error being made must not raise another.
bool debugging_tinyddp() {
  const char* level = std::getenv("TINYDDP_DEBUG");
  return level && *level && strcasecmp(level, "OFF") != 0;
}

std::string with_hint(const std::string& problem, const std::string& hint) {
  return hint.empty() ? problem : problem + "; hint: " + hint;
}

std::string render(const std::string& message, const std::string& expression, const std::string& file, int line) {
  std::string text = "tinyddp error: " + message;
  if (debugging_tinyddp()) text += "\n  " + locate(expression, file, line);
  return text;
}
}  // namespace

Error::Error(std::string message, std::string expression, std::string file, int line)
    : Error(std::move(message), Hint{}, std::move(expression), std::move(file), line) {}

Error::Error(std::string message, Hint hint, std::string expression, std::string file, int line)
    : std::runtime_error(render(with_hint(message, hint.text), expression, project_relative(file), line)),
      problem_(std::move(message)),
      hint_(std::move(hint.text)),
      expression_(std::move(expression)),
      file_(project_relative(file)),
      line_(line) {}

std::string Error::message() const { return with_hint(problem_, hint_); }

std::string Error::location() const { return locate(expression_, file_, line_); }

namespace detail {
void fail(const char* expression, const char* file, int line, const std::string& message) {
  throw Error(message, expression ? expression : "", file, line);
}
void fail(const char* expression, const char* file, int line, ErrorText text) {
  throw Error(std::move(text.problem), std::move(text.hint), expression ? expression : "", file, line);
}
}  // namespace detail
}  // namespace tinyddp
