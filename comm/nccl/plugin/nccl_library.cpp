// The real NcclApi (comm/nccl/nccl_api.h): thin calls into NCCL, inside libtinyddp_nccl.so.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdlib>
#include <cstring>

#include "tinyddp/comm/nccl/nccl_api.h"

namespace tinyddp::comm {

namespace {

static_assert(int(NcclResult::success) == ncclSuccess &&
                  int(NcclResult::unhandled_cuda_error) == ncclUnhandledCudaError &&
                  int(NcclResult::system_error) == ncclSystemError &&
                  int(NcclResult::internal_error) == ncclInternalError &&
                  int(NcclResult::invalid_argument) == ncclInvalidArgument &&
                  int(NcclResult::invalid_usage) == ncclInvalidUsage &&
                  int(NcclResult::remote_error) == ncclRemoteError && int(NcclResult::in_progress) == ncclInProgress,
              "NcclResult must keep ncclResult_t's values");
static_assert(sizeof(ncclUniqueId) == sizeof(NcclUniqueId), "NcclUniqueId must hold an ncclUniqueId");

NcclResult result(ncclResult_t r) { return NcclResult(int(r)); }
ncclComm_t handle(NcclComm comm) { return static_cast<ncclComm_t>(comm); }
cudaStream_t stream_of(CudaStream stream) { return static_cast<cudaStream_t>(stream); }

// False for a dtype NCCL does not take (the backend refuses those before calling).
bool nccl_type(DType t, ncclDataType_t* out) {
  switch (t) {
    case DType::f32: *out = ncclFloat32; return true;
    case DType::f64: *out = ncclFloat64; return true;
    case DType::i32: *out = ncclInt32; return true;
    case DType::i64: *out = ncclInt64; return true;
    case DType::bf16: *out = ncclBfloat16; return true;
    case DType::f16: *out = ncclFloat16; return true;
    default: return false;
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::avg: return ncclAvg;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::min: return ncclMin;
    case ReduceOp::prod: return ncclProd;
  }
  return ncclSum;
}

// NCCL orders the collectives of one communicator (they are on one stream), but two communicators on
// one device -- a DDP group and a ZeRO or pipeline group, say -- each launch on their own stream, and
// their kernels may then meet on the GPU in a different order on different ranks: each waits for
// peers that are busy in the other communicator's kernel, and the job hangs. NCCL 2.26 and later
// order such launches in the host's launch order when NCCL_LAUNCH_ORDER_IMPLICIT=1, which is what a
// tinyddp job gives when its ranks run the same program (a group's collectives are launched in call
// order, under its launch lock). NCCL reads the variable once, at its first launch, so it is set before
// the first communicator; a value the user set is kept (=0 turns it off). With older NCCL every rank
// must launch the groups' collectives in the same order itself.
void order_launches_across_communicators() {
  static const bool done = [] {
    int version = 0;
    if (ncclGetVersion(&version) == ncclSuccess && version >= 22600) setenv("NCCL_LAUNCH_ORDER_IMPLICIT", "1", 0);
    return true;
  }();
  (void)done;
}

class NcclLibrary final : public NcclApi {
 public:
  std::string describe() const override {
    int version = 0;
    ncclGetVersion(&version);
    return "NCCL " + std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) + "." +
           std::to_string(version % 100);
  }

  NcclResult get_unique_id(NcclUniqueId* id) override {
    ncclUniqueId raw;
    ncclResult_t r = ncclGetUniqueId(&raw);
    std::memcpy(id->data(), &raw, sizeof raw);
    return result(r);
  }
  NcclResult comm_init_rank(NcclComm* comm, int nranks, const NcclUniqueId& id, int rank, bool blocking) override {
    ncclUniqueId raw;
    std::memcpy(&raw, id.data(), sizeof raw);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = blocking ? 1 : 0;
    order_launches_across_communicators();
    ncclComm_t made = nullptr;
    ncclResult_t r = ncclCommInitRankConfig(&made, nranks, raw, rank, &config);
    *comm = made;
    return result(r);
  }
  NcclResult comm_get_async_error(NcclComm comm, NcclResult* state) override {
    ncclResult_t s = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(handle(comm), &s);
    *state = result(s);
    return result(r);
  }
  NcclResult comm_finalize(NcclComm comm) override { return result(ncclCommFinalize(handle(comm))); }
  NcclResult comm_destroy(NcclComm comm) override { return result(ncclCommDestroy(handle(comm))); }
  NcclResult comm_abort(NcclComm comm) override { return result(ncclCommAbort(handle(comm))); }
  NcclResult group_start() override { return result(ncclGroupStart()); }
  NcclResult group_end() override { return result(ncclGroupEnd()); }

  NcclResult all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, NcclComm comm,
                        CudaStream stream) override {
    ncclDataType_t type;
    if (!nccl_type(dtype, &type)) return NcclResult::invalid_argument;
    return result(ncclAllReduce(send, recv, count, type, nccl_op(op), handle(comm), stream_of(stream)));
  }
  NcclResult broadcast(const void* send, void* recv, size_t count, DType dtype, int root, NcclComm comm,
                       CudaStream stream) override {
    ncclDataType_t type;
    if (!nccl_type(dtype, &type)) return NcclResult::invalid_argument;
    return result(ncclBroadcast(send, recv, count, type, root, handle(comm), stream_of(stream)));
  }
  NcclResult all_gather(const void* send, void* recv, size_t count, DType dtype, NcclComm comm,
                        CudaStream stream) override {
    ncclDataType_t type;
    if (!nccl_type(dtype, &type)) return NcclResult::invalid_argument;
    return result(ncclAllGather(send, recv, count, type, handle(comm), stream_of(stream)));
  }
  NcclResult reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, NcclComm comm,
                            CudaStream stream) override {
    ncclDataType_t type;
    if (!nccl_type(dtype, &type)) return NcclResult::invalid_argument;
    return result(ncclReduceScatter(send, recv, count, type, nccl_op(op), handle(comm), stream_of(stream)));
  }

  std::string error_string(NcclResult r) override { return ncclGetErrorString(ncclResult_t(int(r))); }
  std::string last_error(NcclComm comm) override {
    const char* text = ncclGetLastError(handle(comm));
    return text ? text : "";
  }
};

}  // namespace
}  // namespace tinyddp::comm

extern "C" __attribute__((visibility("default"))) tinyddp::comm::NcclApi* tinyddp_nccl_api(int abi) {
  static tinyddp::comm::NcclLibrary library;
  return abi == tinyddp::kCudaPluginAbi ? &library : nullptr;
}
