#include "tinyddp/core/run_main.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "tinyddp/core/error.h"

namespace tinyddp {

namespace {

constexpr int kFailed = 1;  // core/command_line.h's kFailed; that header needs CLI11, the library does not

void print_failure(const std::exception& failure) {
  std::fprintf(stderr, "%s\n", failure_text(failure).c_str());
  std::fflush(stderr);
}

std::terminate_handler g_previous_handler = nullptr;

[[noreturn]] void end_with_exit_code() {
  if (std::exception_ptr current = std::current_exception()) {
    try {
      std::rethrow_exception(current);
    } catch (const std::exception& failure) {
      print_failure(failure);
      std::fflush(nullptr);
      // Not exit(): other threads (a store server, a data loader) may still run, and static
      // destructors would pull their objects from under them.
      std::_Exit(kFailed);
    } catch (...) {}
  }
  if (g_previous_handler) g_previous_handler();
  std::abort();
}

}  // namespace

std::string failure_text(const std::exception& failure) {
  // An Error's text starts with "tinyddp error: " already.
  if (dynamic_cast<const Error*>(&failure)) return failure.what();
  return std::string("error: ") + failure.what();
}

void exit_on_uncaught_exception() {
  static std::once_flag once;
  std::call_once(once, [] { g_previous_handler = std::set_terminate(end_with_exit_code); });
}

namespace detail {
int run_main(const std::function<int()>& body) {
  try {
    return body();
  } catch (const std::exception& failure) {
    print_failure(failure);
  } catch (...) {
    std::fprintf(
        stderr,
        "error: an exception that is not a std::exception; hint: throw std::exception or one derived from it\n");
  }
  return kFailed;
}
}  // namespace detail

}  // namespace tinyddp
