// The CUDA half of tinyddp: shared libraries loaded the first time they are needed.
//
//   libtinyddp_cuda.so   core/cuda/ and kernels/cuda/: the CUDA runtime, the kernels, cuBLAS(Lt)
//   libtinyddp_nccl.so   comm/nccl/plugin/: NCCL
//
// Every tinyddp program is built without a link to any NVIDIA library. A program that never touches
// a GPU (the CPU path, MultiDevice's spawner, a launcher) never loads one: it starts in a few
// megabytes, and it starts on a machine where the CUDA libraries are not installed at all. The first
// CUDA allocation loads libtinyddp_cuda.so, whose dependencies (libcudart, libcublas, libcublasLt)
// the dynamic loader then finds as for any program; the first NCCL process group loads
// libtinyddp_nccl.so.
//
// Why whole libraries on demand, rather than dlopen of each NVIDIA library with a table of its
// functions: nvcc-compiled kernels talk to the CUDA runtime behind the program's back (fat-binary
// registration when the library loads, launch stubs), so stubbing the runtime means re-implementing
// its private registration interface, which changes between toolkits. Here the CUDA half keeps
// calling the documented APIs through their real headers, linked normally: the dynamic loader checks
// symbol versions and names a missing library itself. The seam between the halves is narrow and
// plain (core/cuda_api.h, kernels/cuda/cuda_kernels.h, comm/nccl/nccl_api.h: pointers, sizes,
// handles), so the rest of tinyddp never sees a CUDA header and compiles the same with and without
// CUDA, and fake devices (test/support/fake_cuda.h) can stand in for the real half in tests. ONNX Runtime
// loads its CUDA execution provider, and NCCL its network and tuner plugins, the same way.
//
// Where the libraries are looked for, in order: $TINYDDP_PLUGIN_DIR; the folder of the program (or of
// the tinyddp library) and ../lib beside it (a build tree: bin/ and lib/; an install: bin/ and lib/);
// the build folder and the install folder this copy of tinyddp was configured with.
#pragma once

#include <string>

#include "tinyddp/core/cuda_api.h"
#include "tinyddp/core/error.h"

namespace tinyddp {

constexpr const char* kCudaHalfLibrary = "libtinyddp_cuda.so";
constexpr const char* kNcclHalfLibrary = "libtinyddp_nccl.so";

// The path `library` would be loaded from, or "" when no candidate exists; `searched` (optional)
// receives the folders looked in.
std::string find_cuda_half(const std::string& library, std::string* searched = nullptr);

// Loads `library` (once per process) and returns its entry point `symbol`. Throws an error naming the
// library, the folders searched or dlerror()'s reason (a missing libcudart.so.13, say), and a hint.
void* cuda_half_entry(const std::string& library, const char* symbol);

// The interface `library` hands out from its entry point `symbol` (a function taking kCudaPluginAbi).
// Throws when the library was built for another version of these interfaces: a stale module beside a
// newer program is refused with a message instead of crashing.
template <typename Interface>
Interface* cuda_half_interface(const std::string& library, const char* symbol) {
  using Entry = Interface* (*)(int abi);
  Interface* made = reinterpret_cast<Entry>(cuda_half_entry(library, symbol))(kCudaPluginAbi);
  TINYDDP_CHECK(made != nullptr, library, " was built for another version of tinyddp (its interfaces are not version ",
                kCudaPluginAbi, ")", hint("rebuild, or set TINYDDP_PLUGIN_DIR to the matching build"));
  return made;
}

}  // namespace tinyddp
