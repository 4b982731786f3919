// FunctionRef: a callable borrowed for one call. It must call the very object it was given (no
// copy), pass the arguments through as they are, and hand back the result.
#include <doctest/doctest.h>

#include <memory>
#include <string>

#include "tinyddp/core/function_ref.h"

using tinyddp::FunctionRef;

namespace {

// Counts its calls and its copies: a FunctionRef that copied it would leave `calls` at 0 here.
struct Counter {
  int calls = 0;
  int* copies;
  explicit Counter(int* c) : copies(c) {}
  Counter(const Counter& other) : calls(other.calls), copies(other.copies) { ++*copies; }
  int operator()(int add) { return calls += add; }
};

int twice(int x) { return 2 * x; }

int call_with(FunctionRef<int(int)> f, int x) { return f(x); }

}  // namespace

TEST_CASE("FunctionRef calls the object it refers to, never a copy") {
  int copies = 0;
  Counter counter(&copies);
  CHECK(call_with(counter, 3) == 3);
  CHECK(call_with(counter, 4) == 7);
  CHECK(counter.calls == 7);
  CHECK(copies == 0);
}

TEST_CASE("FunctionRef passes arguments through and returns the result") {
  CHECK(call_with(twice, 21) == 42);
  CHECK(call_with([](int x) { return x - 1; }, 10) == 9);
  // A move-only argument goes through without a copy, to the callable that takes it.
  auto consume = [](std::unique_ptr<std::string> s) { return s ? *s + "!" : std::string(); };
  FunctionRef<std::string(std::unique_ptr<std::string>)> ref = consume;
  CHECK(ref(std::make_unique<std::string>("moved")) == "moved!");
  // A reference argument refers to the caller's object.
  std::string text = "a";
  auto append = [](std::string& s) { s += "b"; };
  FunctionRef<void(std::string&)> appender = append;
  appender(text);
  CHECK(text == "ab");
}
