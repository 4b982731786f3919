// Errors: every failure is an exception that says what failed, where, and what to do about it.
//
//   TINYDDP_CHECK(x.dim() == 2, "Linear expects a 2-D input, got ", x.describe(),
//                 "; hint: flatten the batch to [batch, features] first");
//
// produces
//
//   tinyddp error: Linear expects a 2-D input, got f32[3, 4, 5] on cpu; hint: flatten ...
//
// and, when TINYDDP_DEBUG is set (INFO or DETAIL), a second line for whoever debugs tinyddp itself:
//
//     check `x.dim() == 2` failed at nn/linear.cpp:31
//
// A user is told what failed and what to do; where in the library it was noticed helps only the
// library's own developers, so it stays out of the message unless asked for (location() has it always).
// Library code throws; only a program's main() decides to exit (core/run_main.h).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace tinyddp {

class Error : public std::runtime_error {
 public:
  Error(std::string message, std::string expression, std::string file, int line);

  const std::string& message() const { return message_; }
  const std::string& expression() const { return expression_; }
  const std::string& file() const { return file_; }
  int line() const { return line_; }
  // "check `x.dim() == 2` failed at nn/linear.cpp:31", or "raised at ..." for TINYDDP_FAIL.
  std::string location() const;

 private:
  std::string message_, expression_, file_;
  int line_;
};

namespace detail {

template <typename... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

[[noreturn]] void fail(const char* expression, const char* file, int line, const std::string& message);

}  // namespace detail
}  // namespace tinyddp

// Throws tinyddp::Error when `cond` is false. The remaining arguments are streamed into the message;
// by convention the message ends with "; hint: <what the user can do>".
#define TINYDDP_CHECK(cond, ...)                                                                  \
  do {                                                                                            \
    if (!(cond)) ::tinyddp::detail::fail(#cond, __FILE__, __LINE__, ::tinyddp::detail::concat(__VA_ARGS__)); \
  } while (0)

// Throws unconditionally (for a `default:` branch or a case that can't be expressed as a condition).
#define TINYDDP_FAIL(...) ::tinyddp::detail::fail(nullptr, __FILE__, __LINE__, ::tinyddp::detail::concat(__VA_ARGS__))
