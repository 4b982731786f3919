// Errors: every failure is an exception that says what failed, where, and what to do about it.
//
//   TINYDDP_CHECK(x.dim() == 2, "Linear expects a 2-D input, got ", x.describe(),
//                 hint("flatten the batch to [batch, features] first"));
//
// produces
//
//   tinyddp error: Linear expects a 2-D input, got f32[3, 4, 5] on cpu; hint: flatten ...
//
// What failed and what to do about it are two fields of the Error (problem(), hint()); the text
// "problem; hint: hint" is written only where the error is printed (what(), message()), so code that
// passes an error on, or reports it to another process, never has to take a message apart.
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
#include <type_traits>

namespace tinyddp {

namespace detail {
template <typename... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}
}  // namespace detail

// What the user can do about an error: the last argument of a TINYDDP_CHECK or TINYDDP_FAIL, its parts
// streamed together as the message's are: hint("give its path (./", name, ")").
struct Hint {
  std::string text;
};
template <typename... Parts>
Hint hint(const Parts&... parts) {
  return Hint{detail::concat(parts...)};
}

class Error : public std::runtime_error {
 public:
  Error(std::string message, std::string expression, std::string file, int line);
  Error(std::string message, Hint hint, std::string expression, std::string file, int line);

  // What failed, without the hint.
  const std::string& problem() const { return problem_; }
  // What the user can do about it; "" when the error gives no hint.
  const std::string& hint() const { return hint_; }
  // Both, as printed: "problem; hint: hint", or the problem alone.
  std::string message() const;
  const std::string& expression() const { return expression_; }
  const std::string& file() const { return file_; }
  int line() const { return line_; }
  // "check `x.dim() == 2` failed at nn/linear.cpp:31", or "raised at ..." for TINYDDP_FAIL.
  std::string location() const;

 private:
  std::string problem_, hint_, expression_, file_;
  int line_;
};

namespace detail {

// A TINYDDP_CHECK's or TINYDDP_FAIL's arguments: the message's parts streamed together, the hint apart.
struct ErrorText {
  std::string problem;
  Hint hint;
};
template <typename... Parts>
ErrorText error_text(const Parts&... parts) {
  ErrorText text;
  std::ostringstream out;
  auto add = [&](const auto& part) {
    if constexpr (std::is_same_v<std::decay_t<decltype(part)>, Hint>) {
      text.hint.text += part.text;
    } else {
      out << part;
    }
  };
  (add(parts), ...);
  text.problem = out.str();
  return text;
}

[[noreturn]] void fail(const char* expression, const char* file, int line, const std::string& message);
[[noreturn]] void fail(const char* expression, const char* file, int line, ErrorText text);

}  // namespace detail
}  // namespace tinyddp

// Throws tinyddp::Error when `cond` is false. The remaining arguments are streamed into the message,
// and by convention the last is hint(<what the user can do>).
#define TINYDDP_CHECK(cond, ...)                                                                                 \
  do {                                                                                                           \
    if (!(cond)) ::tinyddp::detail::fail(#cond, __FILE__, __LINE__, ::tinyddp::detail::error_text(__VA_ARGS__)); \
  } while (0)

// Throws unconditionally (for a `default:` branch or a case that can't be expressed as a condition).
#define TINYDDP_FAIL(...) \
  ::tinyddp::detail::fail(nullptr, __FILE__, __LINE__, ::tinyddp::detail::error_text(__VA_ARGS__))
