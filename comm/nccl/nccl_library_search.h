// Finding libnccl.so.2 where people install it, before the NCCL half is loaded.
//
// The NCCL half (libtinyddp_nccl.so) names libnccl.so.2 as a dependency, and the dynamic loader looks
// for that only on LD_LIBRARY_PATH, in the module's RUNPATH (the toolkit folder it was built against)
// and in ldconfig's cache. NCCL is often elsewhere: a pip wheel (nvidia-nccl-cu12 / -cu13 puts it in
// site-packages/nvidia/nccl/lib), a CUDA toolkit under CUDA_HOME, an NCCL tarball under NCCL_HOME. So
// the library is looked for here, in this order, and loaded by its full path with RTLD_GLOBAL before
// the module: the loader then finds a library of that soname already loaded and takes it.
//
//   1. TINYDDP_NCCL_LIBRARY: the path of the libnccl.so.2 to use. When it is set, nothing else is
//      tried: a wrong path is an error, not a silent fall-through to another NCCL;
//   2. the folders on LD_LIBRARY_PATH (what the loader would take anyway, found first);
//   3. NCCL_HOME's and the CUDA toolkit's lib64/ and lib/ (CUDA_HOME, CUDA_PATH, /usr/local/cuda),
//      and the folder the build found NCCL in;
//   4. the system's library folders (Debian's libnccl2, RHEL's libnccl);
//   5. a pip wheel's nvidia/nccl/lib under the site-packages of VIRTUAL_ENV, CONDA_PREFIX, the python3
//      on PATH and the user's ~/.local.
//
// When none has it, the module is still loaded as it is (an ld.so.conf folder may hold NCCL), and if
// that fails its reason names the places searched.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace tinyddp::comm {

constexpr const char* kNcclLibraryName = "libnccl.so.2";
constexpr const char* kNcclLibraryVariable = "TINYDDP_NCCL_LIBRARY";

// Where to look, in order. from_environment() fills it from the process; tests fill it by hand.
struct NcclSearchPlaces {
  std::optional<std::string> override_path;  // TINYDDP_NCCL_LIBRARY
  std::vector<std::string> folders;          // steps 2-4: folders that may hold libnccl.so.2 itself
  std::vector<std::string> python_prefixes;  // step 5: prefixes whose lib/python3.*/{site,dist}-packages are searched

  static NcclSearchPlaces from_environment();
};

struct NcclLibrarySearch {
  std::string path;      // the libnccl.so.2 found; "" when none
  std::string searched;  // the places looked in, for messages
  std::string problem;   // set when the override names no file
};

// The first libnccl.so.2 of `places`, looking only at files (no library is loaded).
NcclLibrarySearch find_nccl_library(const NcclSearchPlaces& places);

// dlopen(path, RTLD_NOW | RTLD_GLOBAL): "" when it loaded, else what went wrong and what to do.
// `from_override`: the path came from TINYDDP_NCCL_LIBRARY, and the message says so.
std::string preload_nccl_library(const std::string& path, bool from_override);

}  // namespace tinyddp::comm
