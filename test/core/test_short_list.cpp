// short_list: the first items of a list, then how many were left out, as every message that names
// ranks, keys or parameters prints it.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "tinyddp/core/short_list.h"

using tinyddp::in_quotes;
using tinyddp::short_list;

TEST_CASE("short_list shows the first items and counts the rest") {
  auto number = [](int r) { return std::to_string(r); };
  CHECK(short_list(std::vector<int>{}, 3, number).empty());
  CHECK(short_list(std::vector<int>{7}, 3, number) == "7");
  CHECK(short_list(std::vector<int>{1, 2, 3}, 3, number) == "1, 2, 3");
  CHECK(short_list(std::vector<int>{1, 2, 3, 4, 5}, 3, number) == "1, 2, 3, ... (2 more)");
  CHECK(short_list(std::vector<int>{1, 2}, 0, number) == "... (2 more)");
  // Every length from 0 to 20 against the count written out by hand: shown items, then the rest.
  for (size_t n = 0; n <= 20; ++n) {
    std::vector<int> items(n);
    for (size_t i = 0; i < n; ++i) items[i] = int(i);
    std::string expected;
    for (size_t i = 0; i < n && i < 12; ++i) {
      if (i > 0) expected.append(", ");
      expected.append(std::to_string(i));
    }
    if (n > 12) expected.append(", ... (").append(std::to_string(n - 12)).append(" more)");
    CHECK(short_list(items, 12, number) == expected);
  }
}

TEST_CASE("in_quotes keeps empty names and spaces visible in a short_list") {
  CHECK(short_list(std::vector<std::string>{"a b", "", "c"}, 2, in_quotes) == "'a b', '', ... (1 more)");
}
