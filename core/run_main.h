// A program's main() in one line: every failure ends it with one message on stderr and exit code 1.
//
//   int main() {
//     return tinyddp::run_main([&] {
//       ... build, train, save ...
//       return 0;            // or no return at all: a body that returns nothing succeeded with 0
//     });
//   }
//
// An exception the body throws is printed once -- a tinyddp::Error's own text, which says what failed
// and what to do; "error: " and what() for any other std::exception -- and run_main returns 1, the
// "the work started and failed" code of every tinyddp program (core/command_line.h). Nothing aborts.
//
// Cleanup never depends on this catch. An exception that nobody catches ends in std::terminate, which
// unwinds nothing: so the library's own parts that leave things behind (a MultiDevice spawner's
// workers and temporary folder) catch and rethrow around themselves, which unwinds them first. And
// once a program makes a Trainer, an uncaught exception ends it as run_main would (one message, exit
// code 1) instead of "terminate called after throwing ..." and SIGABRT: exit_on_uncaught_exception().
#pragma once

#include <exception>
#include <functional>
#include <string>
#include <type_traits>

namespace tinyddp {

// What run_main prints for `failure` (without the newline).
std::string failure_text(const std::exception& failure);

// Installs, once per process, a std::terminate handler that prints the exception being thrown (as
// run_main does) and ends the process with exit code 1 without running static destructors (other
// threads may still run). Termination without an exception (a bug: a joinable std::thread destroyed,
// say) goes on to the handler that was there before, which aborts.
void exit_on_uncaught_exception();

namespace detail {
int run_main(const std::function<int()>& body);
}

template <typename Body>
int run_main(Body&& body) {
  return detail::run_main([&]() -> int {
    if constexpr (std::is_void_v<std::invoke_result_t<Body&>>) {
      body();
      return 0;
    } else {
      return body();
    }
  });
}

}  // namespace tinyddp
