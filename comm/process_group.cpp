#include "tinyddp/comm/process_group.h"

#include <algorithm>

#include "tinyddp/comm/host_backend.h"
#include "tinyddp/comm/nccl/nccl_api.h"
#include "tinyddp/comm/nccl/nccl_backend.h"
#include "tinyddp/comm/store/rendezvous.h"
#include "tinyddp/comm/store/tcp_store.h"

namespace tinyddp::comm {

void ProcessGroup::check_tensor(const Tensor& t, const char* collective, const char* role) const {
  TINYDDP_CHECK(t.defined(), collective, ": the ", role, " tensor is undefined",
                hint("allocate it (Tensor::empty) first"));
  TINYDDP_CHECK(is_collective_dtype(t.dtype()), collective, ": the ", role, " tensor is ", t.describe(),
                ", but collectives take f32, f64, bf16, f16, i32 or i64", hint("convert it to one of those dtypes"));
}

Tensor ProcessGroup::allocate_symmetric(const Shape& shape, DType dtype) { return Tensor::empty(shape, dtype); }

WorkPtr ProcessGroup::all_reduce_single_rounding(const Tensor&, ReduceOp, const CallOptions&) {
  TINYDDP_FAIL("all_reduce_single_rounding: the ", backend(), " backend does not offer it",
               hint("use the host backend, ",
                    "or all_reduce (which on 16-bit tensors rounds once per reduction step)"));
}

WorkPtr ProcessGroup::reduce_scatter_single_rounding(const Tensor&, const Tensor&, ReduceOp, const CallOptions&) {
  TINYDDP_FAIL("reduce_scatter_single_rounding: the ", backend(), " backend does not offer it",
               hint("use the host ",
                    "backend, or reduce_scatter (which on 16-bit tensors rounds once per reduction step)"));
}

void ProcessGroup::check_same(const Tensor& a, const Tensor& b, const char* collective) const {
  TINYDDP_CHECK(a.dtype() == b.dtype() && a.numel() == b.numel(), collective, ": output ", a.describe(), " and input ",
                b.describe(), " differ", hint("give both the same dtype and number of elements"));
}

void ProcessGroup::check_root(int root, const char* collective) const {
  TINYDDP_CHECK(root >= 0 && root < size_, collective, ": root ", root, " is not a rank of this group of ", size_,
                hint("the root is a rank from 0 to ", size_ - 1));
}

std::vector<std::string> available_backends() {
  if (nccl_available()) return {"host", "nccl"};
  return {"host"};
}

std::string backend_unavailable_reason(const std::string& backend) {
  if (backend == "host") return "";
  if (backend == "nccl") return nccl_unavailable_reason();
  return "no backend is called \"" + backend + "\"";
}

bool backend_available(const std::string& backend) {
  const std::vector<std::string> backends = available_backends();
  return std::find(backends.begin(), backends.end(), backend) != backends.end();
}

std::shared_ptr<ProcessGroup> create_process_group(const std::string& backend, std::shared_ptr<Store> store, int rank,
                                                   int world, const ProcessGroupOptions& options) {
  if (backend == "host") return std::make_shared<HostBackend>(std::move(store), rank, world, options);
  if (backend == "nccl") return create_nccl_process_group(std::move(store), rank, world, options);
  // The hand-written backend was once called "ring", after one of the algorithms it runs.
  TINYDDP_CHECK(backend != "ring", "unknown process group backend 'ring'",
                hint("the backend is called 'host' now; ", "'ring' is one of its algorithms (TINYDDP_ALGO=ring)"));
  TINYDDP_FAIL("unknown process group backend '", backend, "'",
               hint("use \"host\"",
#ifdef TINYDDP_WITH_NCCL
                    " or \"nccl\""
#else
                    " (\"nccl\" needs a build with NCCL)"
#endif
                    ));
}

std::shared_ptr<ProcessGroup> init_process_group(const std::string& backend, const std::string& init_method, int rank,
                                                 int world, const ProcessGroupOptions& options) {
  RendezvousOptions join;
  join.rank = rank;
  join.world_size = world;
  join.timeout = options.timeout;
  if (options.token) join.token = options.token;
  Rendezvous r = rendezvous(init_method, join);
  return create_process_group(backend, r.store, r.rank, r.world_size, options);
}

}  // namespace tinyddp::comm
