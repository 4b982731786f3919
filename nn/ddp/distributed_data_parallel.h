// DistributedDataParallel: train one model on many ranks as if it were one model on one big batch.
//
// Every rank holds a full replica of the model and trains on its own share of each global batch
// (DistributedSampler). After backward, every rank's gradients are replaced by the average over all
// ranks, so every optimizer step applies the same update to the same weights, and the replicas never
// drift apart -- no weights are ever sent after the start. The wrapper does three things:
//
//   1. At construction, it checks that every rank built the same model (parameter names and shapes;
//      a mismatch names the rank and the parameter) and copies rank 0's weights to every rank, so
//      all replicas start identical whatever their seeds.
//   2. forward() arms the Reducer (nn/ddp/reducer.h) and runs the model.
//   3. backward() runs the model's backward, during which the Reducer all-reduces gradient buckets
//      as soon as they are complete, then waits for the last of them (as PyTorch's autograd engine
//      does when backward finishes). When it returns, param.grad holds the average.
//
//   auto group = comm::create_process_group("host", store, rank, world);
//   nn::DistributedDataParallel ddp(model, group);           // model: any nn::Module
//   nn::Adam optimizer(ddp.named_parameters(), 1e-3);
//   for (const Batch& batch : loader) {                      // loader over a DistributedSampler
//     optimizer.zero_grad();
//     float loss = criterion.forward(ddp.forward(batch.inputs), batch.targets);
//     ddp.backward(criterion.backward(), /*want_input_grad=*/false);
//     optimizer.step();
//   }
//
// Gradient accumulation: backward passes run under no_sync() only accumulate locally; the next
// backward outside it all-reduces the sum (communication once per accumulated step).
//
//   { auto guard = ddp.no_sync(); ddp.backward(...); }       // micro-batch 1: local only
//   ddp.backward(...);                                       // micro-batch 2: all-reduces 1 + 2
//
// Comm hooks: register_comm_hook(state, hook) replaces how each bucket is reduced (comm_hook.h),
// e.g. with a user's own reduction or ZeRO's reduce-scatter; the default is the averaging all-reduce.
//
// Names: named_parameters() are the wrapped model's own ("0.weight", ...), without the "module."
// prefix PyTorch's DDP adds, so checkpoints move between the wrapped and the plain model.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tinyddp/comm/process_group.h"
#include "tinyddp/nn/ddp/comm_hook.h"
#include "tinyddp/nn/ddp/reducer.h"
#include "tinyddp/nn/module.h"

namespace tinyddp::nn {

struct DdpOptions {
  double bucket_cap_mb = 25;   // MiB; PyTorch's bucket_cap_mb
  double first_bucket_mb = 1;  // MiB; PyTorch's dist._DEFAULT_FIRST_BUCKET_BYTES
  // Models whose layers do not all run in every iteration: parameters without a gradient at the end
  // of backward count as ready (this rank contributes nothing new for them) instead of an error.
  bool find_unused_parameters = false;
  // Copy rank 0's weights to every rank at construction (PyTorch always does).
  bool broadcast_parameters = true;
  // Lay the buckets out again, once, in the order gradients became ready in the first iteration.
  bool rebuild_buckets = true;
};

class DistributedDataParallel : public Module {
 public:
  // Wraps `module`, which must outlive this object. Collective: every rank of `group` must construct
  // its DistributedDataParallel at the same point. Move the model to its device first.
  DistributedDataParallel(Module& module, std::shared_ptr<comm::ProcessGroup> group, DdpOptions options = {});
  // Wraps and keeps `module` alive.
  DistributedDataParallel(std::shared_ptr<Module> module, std::shared_ptr<comm::ProcessGroup> group,
                          DdpOptions options = {});
  ~DistributedDataParallel() override;
  // The reducer's hooks and no_sync() guards refer to this object: it stays where it was built.
  DistributedDataParallel(DistributedDataParallel&&) = delete;
  DistributedDataParallel& operator=(DistributedDataParallel&&) = delete;

  // Arms the reducer (unless inside no_sync()) and runs the model's forward.
  Tensor forward(const Tensor& input) override;
  // Runs the model's backward -- buckets are all-reduced while it runs -- then waits for every bucket
  // (wait_for_gradients). Under no_sync() it is the model's plain backward.
  Tensor backward(const Tensor& grad_output, bool want_input_grad = true) override;
  // "DistributedDataParallel(\n  (module): Sequential(...)\n)"
  std::string describe() const override;
  // The wrapped model's parameters, under the wrapped model's own names.
  std::vector<NamedParameter> named_parameters() override;
  // Refused: moving would replace the gradients that the buckets are; move the model before wrapping.
  void to(Device device) override;

  // Waits until every bucket's all-reduce has finished (backward() already calls it; calling it again,
  // or outside an iteration, does nothing). PyTorch runs this when autograd finishes backward.
  void wait_for_gradients() { reducer_->finalize(); }

  // PyTorch's register_comm_hook(state, hook): from now on every bucket is reduced by `hook`, run
  // over `state` (the process group its collectives use; null: this DDP's own). Call it once, on
  // every rank, after wrapping and before the first backward; a second call, or one after a
  // synchronised backward, throws. The hook's own state lives in what the function captures.
  void register_comm_hook(std::shared_ptr<comm::ProcessGroup> state, CommHook hook);

  // Runs `hook` at the start of every forward(), before anything else (ZeRO waits there for the
  // all-gather of the updated parameters). Returns an id for remove_forward_pre_hook.
  int add_forward_pre_hook(std::function<void()> hook);
  void remove_forward_pre_hook(int id);

  // Gradient accumulation: while the returned guard lives, forward() does not arm the reducer, so the
  // following backward only accumulates into param.grad. The guard restores the previous mode.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DistributedDataParallel& ddp);
    ~NoSyncGuard();
    NoSyncGuard(NoSyncGuard&& other) noexcept;
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(NoSyncGuard&&) = delete;

   private:
    DistributedDataParallel* ddp_;
    bool previous_;
  };
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*this); }
  // False inside no_sync().
  bool require_gradient_sync() const { return require_sync_; }

  Module& module() { return *module_; }
  const Module& module() const { return *module_; }
  comm::ProcessGroup& process_group() { return *group_; }
  const std::shared_ptr<comm::ProcessGroup>& process_group_ptr() const { return group_; }
  Reducer& reducer() { return *reducer_; }
  const DdpOptions& options() const { return options_; }
  // One line per bucket: its bytes and its parameters, in launch order. Printed on stderr by rank 0
  // at construction and after the rebuild when TINYDDP_DEBUG=INFO.
  std::string describe_buckets() const { return reducer_->describe_buckets(); }

 private:
  void initialize();
  // Throws, on every rank, when some rank's parameter names or shapes differ from rank 0's.
  void check_replicas_match();
  void broadcast_parameters();

  std::shared_ptr<Module> owned_;  // set by the shared_ptr constructor
  Module* module_;
  std::shared_ptr<comm::ProcessGroup> group_;
  DdpOptions options_;
  std::unique_ptr<Reducer> reducer_;
  bool require_sync_ = true;
  std::vector<std::pair<int, std::function<void()>>> forward_pre_hooks_;
  int next_hook_id_ = 0;
};

}  // namespace tinyddp::nn
