// NcclApi: the NCCL calls the nccl backend makes, as one interface with two implementations.
//
//   the NCCL half (comm/nccl/plugin/nccl_library.cpp, inside libtinyddp_nccl.so): thin calls into
//       NCCL itself, loaded with the first nccl process group (core/cuda_plugin.h says why);
//   fake NCCL (test/support/fake_nccl.h): collectives on fake CUDA devices, moved by the host backend,
//       with NCCL's rules enforced, so the backend's logic is tested without a GPU.
//
// The calls keep NCCL's own semantics (a non-blocking communicator answers in_progress until a call
// has been taken in; ncclCommFinalize, then ncclCommDestroy; one thread at a time per communicator),
// and the results keep NCCL's numbers, so messages can name them as NCCL's documentation does.
#pragma once

#include <array>
#include <cstddef>
#include <string>

#include "tinyddp/comm/reduce_op.h"
#include "tinyddp/core/cuda_api.h"
#include "tinyddp/core/dtype.h"

namespace tinyddp::comm {

// ncclResult_t, value for value.
enum class NcclResult : int {
  success = 0,
  unhandled_cuda_error = 1,
  system_error = 2,
  internal_error = 3,
  invalid_argument = 4,
  invalid_usage = 5,
  remote_error = 6,
  in_progress = 7,
};

using NcclComm = void*;                      // ncclComm_t
using NcclUniqueId = std::array<char, 128>;  // ncclUniqueId (NCCL_UNIQUE_ID_BYTES)

class NcclApi {
 public:
  virtual ~NcclApi() = default;
  virtual std::string describe() const = 0;  // "NCCL 2.28.9", "fake NCCL"

  virtual NcclResult get_unique_id(NcclUniqueId* id) = 0;
  // ncclCommInitRankConfig on the calling thread's current CUDA device; blocking = config.blocking.
  virtual NcclResult comm_init_rank(NcclComm* comm, int nranks, const NcclUniqueId& id, int rank, bool blocking) = 0;
  virtual NcclResult comm_get_async_error(NcclComm comm, NcclResult* state) = 0;
  virtual NcclResult comm_finalize(NcclComm comm) = 0;
  virtual NcclResult comm_destroy(NcclComm comm) = 0;
  virtual NcclResult comm_abort(NcclComm comm) = 0;

  virtual NcclResult group_start() = 0;
  virtual NcclResult group_end() = 0;
  // Counts are elements of `dtype` (f32, f64, bf16, f16, i32 or i64). all_gather's `count` is what each rank
  // sends; reduce_scatter's is what each rank receives.
  virtual NcclResult all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, NcclComm comm,
                                CudaStream stream) = 0;
  virtual NcclResult broadcast(const void* send, void* recv, size_t count, DType dtype, int root, NcclComm comm,
                               CudaStream stream) = 0;
  virtual NcclResult all_gather(const void* send, void* recv, size_t count, DType dtype, NcclComm comm,
                                CudaStream stream) = 0;
  virtual NcclResult reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, NcclComm comm,
                                    CudaStream stream) = 0;

  virtual std::string error_string(NcclResult result) = 0;  // ncclGetErrorString
  virtual std::string last_error(NcclComm comm) = 0;        // ncclGetLastError
};

// libtinyddp_nccl.so's entry point for its NcclApi (core/cuda_plugin.h's cuda_half_interface).
constexpr const char* kNcclApiEntryName = "tinyddp_nccl_api";

// Whether process groups of the "nccl" backend can be made here: fake devices are in use (with the
// fake NCCL beside them), or this build made the NCCL half, it is found beside the program, and it
// loads -- with the libnccl.so.2 it needs, found and loaded first where people install it
// (nccl_library_search.h: TINYDDP_NCCL_LIBRARY, the toolkit, the system, a pip wheel). The load is
// tried once (dlopen) and its answer kept, so a missing NCCL is known before a group is made.
bool nccl_available();
// Why nccl_available() is false: "" when it is true.
std::string nccl_unavailable_reason();
// The load check itself, uncached, for the NCCL half at `module_path`: "" when it loads, else why not.
// `nccl_searched`: where libnccl.so.2 was looked for without being found, said in the reason.
std::string nccl_load_problem(const std::string& module_path, const std::string& nccl_searched = "");

// The NCCL that answers on fake CUDA devices (test/support/fake_nccl.h), registered by a program
// linked with the test-support library when it starts; none in the libraries themselves.
void set_nccl_stand_in(NcclApi& (*stand_in)());
// Fake NCCL over fake devices, else the NCCL half (loaded on this call). Throws a clear error when
// this build has no NCCL, or the NCCL half cannot be loaded.
NcclApi& nccl_api();

}  // namespace tinyddp::comm
