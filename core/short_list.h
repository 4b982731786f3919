// A list in a message that stays one line however long the list grows: the first `shown` items joined
// by ", ", then how many were left out -- "'a', 'b', 'c', ... (7 more)". The messages that name ranks,
// store keys or parameters all use it, so a user reads every such list the same way.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace tinyddp {

// `format` turns one item into its text (a rank's number, a key in quotes, ...).
template <typename Item, typename Format>
std::string short_list(const std::vector<Item>& items, size_t shown, Format format) {
  std::string text;
  for (size_t i = 0; i < items.size() && i < shown; ++i) {
    if (i > 0) text += ", ";
    text += format(items[i]);
  }
  if (items.size() > shown) {
    if (!text.empty()) text += ", ";
    text += "... (";
    text += std::to_string(items.size() - shown);
    text += " more)";
  }
  return text;
}

// Names and keys, each in single quotes: a space or an empty name would otherwise blur the list.
inline std::string in_quotes(const std::string& name) { return "'" + name + "'"; }

}  // namespace tinyddp
