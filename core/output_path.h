// Output paths: checked before the work starts, and a fallback when writing still fails at the end.
//
// A program that trains for an hour and then cannot write its model has lost the hour. So:
//
//   check_output_path("--save", save_path);        // at start: throws naming the flag, the path, the fix
//   ... train ...
//   std::string where = write_with_fallback(save_path, [&](const std::string& p) { save_model(p, model); });
//
// check_output_path refuses a path whose directory does not exist or cannot be written, or that names a
// directory. write_with_fallback tries the path; if that throws (the disk filled up, the directory
// went away), it writes to fallback_path(path) instead, says so on stderr, and returns where the data
// went; it throws only when both writes failed.
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace tinyddp {

// Throws an Error naming `what` (the flag or variable that gave the path) unless a file can be
// created or replaced at `path`.
void check_output_path(const std::string& what, const std::string& path);

// Why files cannot be created in `directory` (it must exist), and what to do about it; nothing when
// they can. A read-only file system (statvfs's ST_RDONLY, or EROFS) is told apart from permissions,
// which only the owner or another directory fixes.
struct Unwritable {
  std::string why;   // "is on a read-only file system", "is not writable by this user", ...
  std::string hint;  // without "hint: "
};
std::optional<Unwritable> why_unwritable(const std::string& directory);

// Where write_with_fallback writes when `path` fails: $TMPDIR (or /tmp)/<file name>.<pid>.
std::string fallback_path(const std::string& path);

// Writes with `write(path)`; on failure writes with `write(fallback_path(path))` and prints a line on
// stderr that names both paths and the first failure. Returns the path written.
std::string write_with_fallback(const std::string& path, const std::function<void(const std::string&)>& write);

}  // namespace tinyddp
