#include "tinyddp/core/cuda_plugin.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <vector>

#include "tinyddp/core/env.h"
#include "tinyddp/core/error.h"

namespace tinyddp {

namespace {

// The folder of the file this function was linked into: the program itself when tinyddp is linked
// statically, the tinyddp library when it is shared.
std::string folder_of_this_code() {
  Dl_info info{};
  const bool named = dladdr(reinterpret_cast<void*>(&folder_of_this_code), &info) != 0 && info.dli_fname != nullptr &&
                     std::string(info.dli_fname).find('/') != std::string::npos;
  // For the main program dli_fname may be a bare argv[0]; /proc/self/exe is then the exact path.
  std::error_code error;
  std::filesystem::path image = std::filesystem::canonical(named ? info.dli_fname : "/proc/self/exe", error);
  return error ? "" : image.parent_path().string();
}

std::vector<std::string> candidate_folders() {
  std::vector<std::string> folders;
  if (std::optional<std::string> dir = env::text("TINYDDP_PLUGIN_DIR")) folders.push_back(*dir);
  std::string here = folder_of_this_code();
  if (!here.empty()) {
    folders.push_back(here);
    folders.push_back(here + "/../lib");
  }
#ifdef TINYDDP_PLUGIN_BUILD_DIR
  folders.push_back(TINYDDP_PLUGIN_BUILD_DIR);
#endif
#ifdef TINYDDP_PLUGIN_INSTALL_DIR
  folders.push_back(TINYDDP_PLUGIN_INSTALL_DIR);
#endif
  return folders;
}

struct Loaded {
  std::mutex mutex;
  std::map<std::string, void*> handles;  // never closed: kernels and contexts live until exit
};

Loaded& loaded() {
  static Loaded* l = new Loaded;  // never destroyed: static destructors may still free CUDA memory
  return *l;
}

}  // namespace

std::string find_cuda_half(const std::string& library, std::string* searched) {
  std::string list;
  for (const std::string& folder : candidate_folders()) {
    std::string path = folder + "/" + library;
    if (access(path.c_str(), R_OK) == 0) return std::filesystem::path(path).lexically_normal().string();
    list += (list.empty() ? "" : ", ") + folder;
  }
  if (searched) *searched = list;
  return "";
}

void* cuda_half_entry(const std::string& library, const char* symbol) {
  Loaded& l = loaded();
  std::lock_guard<std::mutex> lock(l.mutex);
  void*& handle = l.handles[library];
  if (handle == nullptr) {
    std::string searched;
    std::string path = find_cuda_half(library, &searched);
    TINYDDP_CHECK(
        !path.empty(), "tinyddp's CUDA half ", library, " was not found (looked in ", searched, ")",
        hint("keep it in the program's folder or in ../lib beside it, or set TINYDDP_PLUGIN_DIR to its folder"));
    // RTLD_NOW: a missing dependency or symbol is reported here, by name, not at some later call.
    handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = dlerror();
      TINYDDP_FAIL(
          "could not load tinyddp's CUDA half ", path, ": ", why ? why : "dlopen failed",
          hint("the CUDA libraries it names must be installed (the CUDA toolkit's lib64, NCCL) and found by the "
               "dynamic loader (ldconfig, or LD_LIBRARY_PATH), or run on the CPU instead (Device::cpu())"));
    }
  }
  void* entry = dlsym(handle, symbol);
  TINYDDP_CHECK(
      entry != nullptr, library, " has no entry point ", symbol,
      hint("it was built from another version of tinyddp: rebuild, or set TINYDDP_PLUGIN_DIR to the right build"));
  return entry;
}

}  // namespace tinyddp
