#include "tinyddp/core/env.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include "tinyddp/core/error.h"

namespace tinyddp::env {

namespace {

bool same_word(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::toupper(static_cast<unsigned char>(a[i])) != std::toupper(static_cast<unsigned char>(b[i]))) return false;
  return true;
}

}  // namespace

std::optional<std::string> text(std::string_view name) {
  const char* value = std::getenv(std::string(name).c_str());
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

uint64_t parse_unsigned_integer(std::string_view name, std::string_view text, uint64_t min, uint64_t max) {
  uint64_t value = 0;
  const char* end = text.data() + text.size();
  auto [stop, error] = std::from_chars(text.data(), end, value);
  TINYDDP_CHECK(!text.empty() && error == std::errc() && stop == end && value >= min && value <= max, name, "='", text,
                "' is not a whole number from ", min, " to ", max,
                hint("write the number in decimal digits only ", "(no sign, no unit), or unset ", name,
                     " for the default"));
  return value;
}

std::optional<uint64_t> unsigned_integer(std::string_view name, uint64_t min, uint64_t max) {
  std::optional<std::string> value = text(name);
  if (!value) return std::nullopt;
  return parse_unsigned_integer(name, *value, min, max);
}

int restart_count() {
  for (const char* name : {"TINYDDP_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT"})
    if (std::optional<uint64_t> value = unsigned_integer(name, 0, 1 << 24)) return int(*value);
  return 0;
}

std::chrono::milliseconds parse_seconds(std::string_view name, std::string_view text, double max_seconds) {
  std::string_view number = text;
  if (!number.empty() && (number.back() == 's' || number.back() == 'S')) number.remove_suffix(1);
  double value = 0;
  const char* end = number.data() + number.size();
  auto [stop, error] = std::from_chars(number.data(), end, value);
  TINYDDP_CHECK(!number.empty() && error == std::errc() && stop == end && value > 0 && value <= max_seconds, name, "='",
                text, "' is not a number of seconds above 0 and at most ", max_seconds,
                hint("write seconds as digits, with a fraction if needed (30, 2.5 or 30s; no other unit), or unset ",
                     name, " for the default"));
  return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(value * 1000)));
}

std::optional<std::chrono::milliseconds> seconds(std::string_view name, double max_seconds) {
  std::optional<std::string> value = text(name);
  if (!value) return std::nullopt;
  return parse_seconds(name, *value, max_seconds);
}

bool parse_flag(std::string_view name, std::string_view text) {
  for (std::string_view yes : {"1", "true", "yes", "on"})
    if (same_word(text, yes)) return true;
  for (std::string_view no : {"0", "false", "no", "off"})
    if (same_word(text, no)) return false;
  TINYDDP_FAIL(name, "='", text, "' is neither on nor off",
               hint("write 1, true, yes or on to turn it on, 0, false, ", "no or off to turn it off, or unset ", name));
}

std::optional<bool> flag(std::string_view name) {
  std::optional<std::string> value = text(name);
  if (!value) return std::nullopt;
  return parse_flag(name, *value);
}

size_t parse_choice_index(std::string_view name, std::string_view text, std::span<const std::string_view> words) {
  for (size_t i = 0; i < words.size(); ++i)
    if (same_word(text, words[i])) return i;
  std::string allowed;
  for (size_t i = 0; i < words.size(); ++i)
    allowed += (i == 0 ? "" : i + 1 == words.size() ? " or " : ", ") + std::string(words[i]);
  TINYDDP_FAIL(name, "='", text, "' is not one of ", allowed,
               hint("set ", name, " to one of those (any case), ", "or unset it"));
}

}  // namespace tinyddp::env
