#include "tinyddp/core/output_path.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "tinyddp/core/error.h"

namespace tinyddp {

namespace fs = std::filesystem;

void check_output_path(const std::string& what, const std::string& path) {
  TINYDDP_CHECK(!path.empty(), what, " is empty", hint("name a file to write, e.g. out.safetensors"));
  std::error_code error;
  const fs::path file(path);
  TINYDDP_CHECK(!fs::is_directory(file, error), what, " ", path, " is a directory",
                hint("name a file inside it, e.g. ", (file / "out").string()));
  const fs::path dir = file.has_parent_path() ? file.parent_path() : fs::path(".");
  TINYDDP_CHECK(fs::is_directory(dir, error), what, " ", path, ": the directory ", dir.string(), " does not exist",
                hint("create it first (mkdir -p ", dir.string(), ") or write somewhere else"));
  // The file is written as a temporary beside it and renamed over it: the directory must be writable.
  if (std::optional<Unwritable> unwritable = why_unwritable(dir.string()))
    TINYDDP_FAIL(what, " ", path, ": the directory ", dir.string(), " ", unwritable->why, hint(unwritable->hint));
}

std::optional<Unwritable> why_unwritable(const std::string& directory) {
  // Asked first: root may write anywhere by permissions, but not on a read-only mount.
  struct statvfs file_system {};
  const bool read_only = statvfs(directory.c_str(), &file_system) == 0 && (file_system.f_flag & ST_RDONLY);
  if (!read_only && access(directory.c_str(), W_OK | X_OK) == 0) return std::nullopt;
  if (read_only || errno == EROFS)
    return Unwritable{"is on a read-only file system", "choose a directory on a writable file system (findmnt -T " +
                                                           directory + " shows its mount and options)"};
  if (errno == EACCES || errno == EPERM)
    return Unwritable{"is not writable by this user",
                      "choose a directory you can write to, or ask its owner for write permission (ls -ld " +
                          directory + ")"};
  return Unwritable{std::string("cannot be written: ") + std::strerror(errno), "choose another directory"};
}

std::string fallback_path(const std::string& path) {
  const char* tmp = std::getenv("TMPDIR");
  fs::path dir = tmp && *tmp ? fs::path(tmp) : fs::path("/tmp");
  std::string name = fs::path(path).filename().string();
  if (name.empty()) name = "output";
  return (dir / (name + "." + std::to_string(getpid()))).string();
}

std::string write_with_fallback(const std::string& path, const std::function<void(const std::string&)>& write) {
  std::string first_failure;
  try {
    write(path);
    return path;
  } catch (const std::exception& e) {
    first_failure = e.what();
  }
  const std::string fallback = fallback_path(path);
  try {
    write(fallback);
  } catch (const std::exception& e) {
    TINYDDP_FAIL("cannot write ", path, " (", first_failure, "), nor the fallback ", fallback, " (", e.what(), ")",
                 hint("free some disk space or check the permissions, and run again"));
  }
  std::fprintf(stderr, "cannot write %s (%s); wrote %s instead, so nothing is lost\n", path.c_str(),
               first_failure.c_str(), fallback.c_str());
  return fallback;
}

}  // namespace tinyddp
