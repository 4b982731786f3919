// Env: how the library reads its environment variables (TINYDDP_* and the launchers' RANK, ...).
//
// Every variable goes through a typed reader that knows what its value may be:
//
//   size_t bytes = env::unsigned_integer("TINYDDP_TCP_BUFFER_BYTES").value_or(0);
//   bool bind_all = env::flag("TINYDDP_BIND_ALL").value_or(false);
//   auto level = env::choice<DebugLevel>("TINYDDP_DEBUG", {{"OFF", off}, {"INFO", info}, {"DETAIL", detail}});
//
// Unset or empty means "not given" (std::nullopt: the caller's default applies). Anything else must
// parse, or the reader throws an Error naming the variable, the value it found and the values it
// allows, before any work starts:
//
//   TINYDDP_SHM_FIFO_BYTES='1M' is not a whole number from 4096 to 1073741824; hint: write the
//   number in digits only (no unit), or unset TINYDDP_SHM_FIFO_BYTES for the default
//
// So a typo fails the run at once instead of being silently ignored. The parse_* functions take the
// text itself, for values that come from elsewhere than the process environment (and for tests).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tinyddp::env {

// The variable's text, or nullopt when it is unset or empty.
std::optional<std::string> text(std::string_view name);

// A whole number in [min, max], written in decimal digits only.
uint64_t parse_unsigned_integer(std::string_view name, std::string_view text, uint64_t min = 0,
                                uint64_t max = std::numeric_limits<uint64_t>::max());
std::optional<uint64_t> unsigned_integer(std::string_view name, uint64_t min = 0,
                                         uint64_t max = std::numeric_limits<uint64_t>::max());

// Which attempt of a restarted job this process belongs to, as its launcher says it:
// TINYDDP_RESTART_COUNT (tinyddp-run), else TORCHELASTIC_RESTART_COUNT (torchrun), else 0.
int restart_count();

// A duration in seconds, greater than zero and at most max_seconds: "30", "2.5" (a trailing "s" is
// allowed: "30s"). Returned in milliseconds, rounded up so that "0.0001" is not zero.
std::chrono::milliseconds parse_seconds(std::string_view name, std::string_view text, double max_seconds = 1e7);
std::optional<std::chrono::milliseconds> seconds(std::string_view name, double max_seconds = 1e7);

// A yes/no switch: 1, true, yes, on or 0, false, no, off, in any case.
bool parse_flag(std::string_view name, std::string_view text);
std::optional<bool> flag(std::string_view name);

// One of a fixed set of words, compared without regard to case (TINYDDP_DEBUG=detail is DETAIL).
template <typename T>
struct Choice {
  std::string_view word;
  T value;
};
// The index in `words` of the one `text` names; throws listing every word otherwise.
size_t parse_choice_index(std::string_view name, std::string_view text, std::span<const std::string_view> words);

template <typename T>
T parse_choice(std::string_view name, std::string_view text, std::initializer_list<Choice<T>> choices) {
  std::vector<std::string_view> words;
  for (const Choice<T>& c : choices) words.push_back(c.word);
  return (choices.begin() + parse_choice_index(name, text, words))->value;
}
template <typename T>
std::optional<T> choice(std::string_view name, std::initializer_list<Choice<T>> choices) {
  std::optional<std::string> value = text(name);
  if (!value) return std::nullopt;
  return parse_choice(name, *value, choices);
}

}  // namespace tinyddp::env
