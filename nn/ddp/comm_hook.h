// Comm hooks: how a gradient bucket travels (PyTorch's DistributedDataParallel.register_comm_hook).
//
// By default the Reducer all-reduces each bucket with ReduceOp::avg as soon as backward has filled
// it. A comm hook replaces that one call: the Reducer hands the hook the bucket (its flat gradient
// buffer, its index, which parameters it holds and where) at the very same moment, and the hook
// returns a future. The Reducer waits on the futures in bucket order in finalize(), as it waits on
// the all-reduces, so a hook keeps the overlap with backward. The contract:
//
//   when the future completes, bucket.buffer holds the gradients every rank should step with
//   (for the default hook: the average over the ranks).
//
// A hook may do anything in between: compress the buffer to bf16 and all-reduce that, reduce-scatter
// it (ZeRO, nn/optim/zero_redundancy_optimizer.h), or sum and divide by itself. What it must keep:
// every rank calls its collectives in the same order, bucket after bucket (the Reducer calls the
// hook in bucket order on every rank, so a hook that issues the same collectives per bucket does).
//
// A hook with a last step to do on the result (decompress back into the buffer) gives it to the
// future as `then`: it runs on the thread that waits, right after the collective finished.
//
//   // A bf16 hook is this short:
//   CommHookFuture bf16_compress(comm::ProcessGroup& group, GradBucket& bucket) {
//     Tensor compressed = bucket.buffer.to(DType::bf16);
//     comm::WorkPtr work = group.all_reduce(compressed, comm::ReduceOp::avg, bucket.call_options());
//     return CommHookFuture(work, [buffer = bucket.buffer, compressed]() mutable {
//       buffer.copy_from(compressed.to(DType::f32));
//     });
//   }
//   ddp.register_comm_hook(nullptr, bf16_compress);   // nullptr: DDP's own process group
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tinyddp/comm/process_group.h"
#include "tinyddp/core/tensor.h"

namespace tinyddp::nn {

// One bucket as a hook sees it (PyTorch's dist.GradBucket).
struct GradBucket {
  size_t index = 0;                // launch order: bucket 0 goes first
  bool last = false;               // the last bucket of this iteration
  Tensor buffer;                   // f32, flat: every gradient of the bucket is a view into it
  std::vector<size_t> parameters;  // their indices (registration order), in layout order
  std::vector<int64_t> offsets;    // where each one's gradient starts in `buffer`, in elements
  std::vector<int64_t> lengths;    // and how many elements it has

  // Call options that name this bucket in the flight recorder and in timeout messages.
  comm::CallOptions call_options() const {
    comm::CallOptions call;
    call.bucket = int(index);
    return call;
  }
};

// What a hook returns: the collective's Work, and what to do once it finished.
class CommHookFuture {
 public:
  CommHookFuture() = default;
  // `work` must not be null; `then` (may be empty) runs once, after `work` succeeded, in wait().
  explicit CommHookFuture(comm::WorkPtr work, std::function<void()> then = {});

  // Waits for the work (rethrowing its error), then runs `then` once.
  void wait();
  bool valid() const { return work_ != nullptr; }
  const comm::WorkPtr& work() const { return work_; }

 private:
  comm::WorkPtr work_;
  std::function<void()> then_;
};

// The group a hook runs its collectives on, and the bucket. A hook's own state is what its function
// object captures (a lambda's captures, or a struct's members).
using CommHook = std::function<CommHookFuture(comm::ProcessGroup& group, GradBucket& bucket)>;

// The built-in hooks (torch.distributed.algorithms.ddp_comm_hooks.default_hooks), by name
// ("allreduce", "bf16_compress", ...) for flags such as digits --comm-hook.
namespace comm_hooks {
// The default: all_reduce(bucket.buffer, avg), the sum over the ranks divided once by the world size.
CommHookFuture allreduce(comm::ProcessGroup& group, GradBucket& bucket);

// The compressing hooks send half the bytes: the bucket is converted to a 16-bit copy, that copy is
// all-reduced, and the result is converted back into the buffer when the future is waited on.
// The host backend adds each pair of 16-bit values in f32 and rounds the sum once per step, so the
// error grows with the number of steps (docs/bf16-on-the-wire.md).
//
// bf16 keeps f32's range, so the average is taken as everywhere else: sum, then one division.
CommHookFuture bf16_compress(comm::ProcessGroup& group, GradBucket& bucket);
// f16 reaches only 65504: as PyTorch's fp16_compress_hook does, each rank divides its gradients by
// the world size before the sum (here in f32, before the conversion), so partial sums stay in range.
CommHookFuture fp16_compress(comm::ProcessGroup& group, GradBucket& bucket);
// bf16 on the wire with one rounding: ProcessGroup::all_reduce_single_rounding, where every rank's
// bf16 contribution is summed in f32 and rounded once, so the error stays that of one bf16 rounding
// at any world size. The host backend has it; on another backend the first bucket fails, saying so.
CommHookFuture bf16_single_rounding(comm::ProcessGroup& group, GradBucket& bucket);

// The names above, in that order.
const std::vector<std::string>& names();
// The hook of that name; an unknown name is an error that lists the valid ones.
CommHook by_name(const std::string& name);
}  // namespace comm_hooks

}  // namespace tinyddp::nn
