#include "tinyddp/comm/nccl/nccl_library_search.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "tinyddp/core/env.h"

namespace tinyddp::comm {

namespace fs = std::filesystem;

namespace {

void add_unique(std::vector<std::string>& list, const std::string& item) {
  if (!item.empty() && std::find(list.begin(), list.end(), item) == list.end()) list.push_back(item);
}

void add_library_folders(std::vector<std::string>& folders, const std::string& root) {
  add_unique(folders, root + "/lib64");
  add_unique(folders, root + "/lib");
}

std::vector<std::string> split_path_list(const std::string& list) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= list.size()) {
    size_t end = list.find(':', start);
    if (end == std::string::npos) end = list.size();
    // An empty entry means the current folder to the loader; it is never a place NCCL was installed.
    if (end > start) parts.push_back(list.substr(start, end - start));
    start = end + 1;
  }
  return parts;
}

// The prefix of the first python3 on PATH (PATH's folder is PREFIX/bin), and the prefix it resolves
// to when it is a link (a virtual environment's python3 links the system's).
void add_python_on_path(std::vector<std::string>& prefixes) {
  std::optional<std::string> path = env::text("PATH");
  if (!path) return;
  for (const std::string& folder : split_path_list(*path)) {
    const fs::path python = fs::path(folder) / "python3";
    if (::access(python.c_str(), X_OK) != 0) continue;
    add_unique(prefixes, fs::path(folder).parent_path().lexically_normal().string());
    std::error_code error;
    fs::path resolved = fs::canonical(python, error);
    if (!error) add_unique(prefixes, resolved.parent_path().parent_path().string());
    return;
  }
}

// PREFIX/lib/python3.X/site-packages/nvidia/nccl/lib (and lib64/, dist-packages/: Debian's pip).
std::vector<std::string> wheel_folders(const std::string& prefix) {
  std::vector<std::string> folders;
  for (const char* lib : {"lib", "lib64"}) {
    std::error_code error;
    std::vector<std::string> pythons;
    for (const fs::directory_entry& entry : fs::directory_iterator(fs::path(prefix) / lib, error)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("python3", 0) == 0) pythons.push_back(entry.path().string());
    }
    std::sort(pythons.begin(), pythons.end());
    for (const std::string& python : pythons)
      for (const char* packages : {"site-packages", "dist-packages"})
        folders.push_back(python + "/" + packages + "/nvidia/nccl/lib");
  }
  return folders;
}

bool is_file(const std::string& path) {
  std::error_code error;
  return fs::is_regular_file(path, error);  // follows links: libnccl.so.2 is usually one
}

}  // namespace

NcclSearchPlaces NcclSearchPlaces::from_environment() {
  NcclSearchPlaces places;
  places.override_path = env::text(kNcclLibraryVariable);
  if (std::optional<std::string> paths = env::text("LD_LIBRARY_PATH"))
    for (const std::string& folder : split_path_list(*paths)) add_unique(places.folders, folder);
  for (const char* variable : {"NCCL_HOME", "CUDA_HOME", "CUDA_PATH"})
    if (std::optional<std::string> root = env::text(variable)) add_library_folders(places.folders, *root);
  add_library_folders(places.folders, "/usr/local/cuda");
#ifdef TINYDDP_NCCL_BUILD_LIBRARY_DIR
  add_unique(places.folders, TINYDDP_NCCL_BUILD_LIBRARY_DIR);
#endif
#if defined(__x86_64__)
  add_unique(places.folders, "/usr/lib/x86_64-linux-gnu");
#elif defined(__aarch64__)
  add_unique(places.folders, "/usr/lib/aarch64-linux-gnu");
#endif
  for (const char* folder : {"/usr/lib64", "/usr/local/lib", "/usr/lib"}) add_unique(places.folders, folder);

  for (const char* variable : {"VIRTUAL_ENV", "CONDA_PREFIX"})
    if (std::optional<std::string> prefix = env::text(variable)) add_unique(places.python_prefixes, *prefix);
  add_python_on_path(places.python_prefixes);
  if (std::optional<std::string> home = env::text("HOME")) add_unique(places.python_prefixes, *home + "/.local");
  return places;
}

NcclLibrarySearch find_nccl_library(const NcclSearchPlaces& places) {
  NcclLibrarySearch found;
  if (places.override_path) {
    found.searched = std::string(kNcclLibraryVariable) + "=" + *places.override_path;
    if (is_file(*places.override_path))
      found.path = *places.override_path;
    else
      found.problem = std::string(kNcclLibraryVariable) + "=" + *places.override_path +
                      " names no file; hint: point it at libnccl.so.2 (a pip wheel's nvidia/nccl/lib/libnccl.so.2, "
                      "say), or unset it to search the usual places";
    return found;
  }
  auto look = [&](const std::string& folder) {
    found.searched += (found.searched.empty() ? "" : ", ") + folder;
    const std::string path = folder + "/" + kNcclLibraryName;
    if (!is_file(path)) return false;
    found.path = fs::path(path).lexically_normal().string();
    return true;
  };
  for (const std::string& folder : places.folders)
    if (look(folder)) return found;
  for (const std::string& prefix : places.python_prefixes) {
    bool any = false;
    for (const std::string& folder : wheel_folders(prefix)) {
      any = true;
      const std::string path = folder + "/" + kNcclLibraryName;
      if (is_file(path)) {
        found.searched += (found.searched.empty() ? "" : ", ") + folder;
        found.path = fs::path(path).lexically_normal().string();
        return found;
      }
    }
    // One entry per prefix: listing every python3.X/{site,dist}-packages would bury the message.
    found.searched += (found.searched.empty() ? "" : ", ") + prefix + "/lib/python3*/site-packages/nvidia/nccl/lib" +
                      (any ? "" : " (no python3 there)");
  }
  return found;
}

std::string preload_nccl_library(const std::string& path, bool from_override) {
  // RTLD_GLOBAL: the NCCL half's own dependency on libnccl.so.2 is then met by this copy, by its soname.
  if (::dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL) != nullptr) return "";
  const char* why = ::dlerror();
  const std::string named = from_override ? std::string(kNcclLibraryVariable) + "=" + path : path;
  return named + " is not a loadable NCCL library: " + (why ? why : "dlopen failed") + "; hint: " +
         (from_override
              ? "point " + std::string(kNcclLibraryVariable) + " at libnccl.so.2 itself"
              : std::string("remove or repair it, or set ") + kNcclLibraryVariable + " to the libnccl.so.2 to use");
}

}  // namespace tinyddp::comm
