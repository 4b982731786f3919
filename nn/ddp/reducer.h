// Reducer: the engine of DistributedDataParallel. It turns "every rank has its own gradients" into
// "every rank has the average of all ranks' gradients", and hides most of that communication behind
// the backward pass.
//
// How one iteration goes (the numbers are the parameters' registration order):
//
//   forward        prepare_for_backward(): every bucket expects all its gradients again
//   backward       layer 2 finishes  -> 2.weight, 2.bias ready -> bucket 0 complete -> all_reduce(bucket 0) starts
//                  layer 1 finishes  -> ...                     (bucket 0 is on the wire meanwhile)
//                  layer 0 finishes  -> 0.weight, 0.bias ready -> bucket 1 complete -> all_reduce(bucket 1) starts
//   end            finalize(): wait for every bucket's all-reduce; the gradients are now averages
//   optimizer      step() reads param.grad as usual
//
// What makes it work:
//   - Buckets (bucket_plan.h): gradients grouped in the order backward produces them, a small first
//     bucket so the first all-reduce starts early, later ones up to the cap.
//   - Views, not copies: each bucket is one flat buffer and every parameter's .grad is rebound to a
//     view into it. Backward accumulates straight into the bucket, and the all-reduce of the buffer
//     updates every gradient in it in place: no copy in, no copy out.
//   - Hooks: the Reducer adds a hook to every Parameter; a layer calls mark_grad_ready() the moment
//     that gradient is final (nn/module.h), which is where PyTorch's autograd fires DDP's hook.
//   - Order: a bucket's all-reduce starts when it is complete *and* every bucket before it has
//     started. Collectives must be issued in the same order on every rank (they are matched by
//     position, not by name), and the readiness order may differ between ranks; the bucket order
//     is the one thing all ranks share.
//   - Averaging: buckets are all-reduced with ReduceOp::avg, a sum followed by one division by the
//     world size, so the optimizer sees the mean gradient of the global batch.
//   - Rebuild: the expected order (reverse registration) is a guess. During the first synchronised
//     iteration the Reducer records the order gradients actually became ready; at its end it lays
//     the buckets out once more in that order (rank 0's order, broadcast, so every rank builds the
//     same buckets). As in PyTorch this is skipped with find_unused_parameters, where an order that
//     leaves parameters out says little about the next iteration.
//
// Checks, each an error that names the parameter:
//   - a gradient marked ready twice in one iteration (a layer run twice in one forward);
//   - a gradient never marked ready by the end of backward (a layer that did not run), unless
//     find_unused_parameters is on: then such parameters count as ready with no new gradient (what
//     backward accumulated: nothing), and the all-reduce averages in this rank's zero contribution.
//     (A parameter whose gradient was set to none by zero_grad gets zeros first. PyTorch goes one
//     step further and leaves a gradient that *no* rank produced as None, so the optimizer skips it;
//     here it becomes zeros, which the optimizer does apply -- as with PyTorch's set_to_none=False.)
//
// set_to_none: zero_grad() only forgets the gradients (Parameter::has_grad); the first backward
// writes each one (beta = 0) straight into its place in the bucket, later ones (no_sync) add to it.
// The buckets stay where they are, so no view is ever rebound for it.
//
// Threads: hooks run on the thread that runs backward, so the Reducer's state has one writer. The
// all-reduces themselves run on the process group's communication thread.
//
// Comm hook (comm_hook.h): what "all-reduce the bucket" means can be replaced, once, before the first
// backward: the Reducer then calls the hook where it would have started the all-reduce, and waits on
// the future it returns where it would have waited on the all-reduce. The default hook is that
// all-reduce, so without a registered hook nothing changes, the overlap included.
//
// An Observer sees each iteration's moments (a bucket ready, its all-reduce launched, found
// finished): that is how the trace shows the overlap (bucket_timeline.h), without the Reducer
// knowing of traces.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tinyddp/comm/process_group.h"
#include "tinyddp/nn/ddp/bucket_plan.h"
#include "tinyddp/nn/ddp/comm_hook.h"
#include "tinyddp/nn/module.h"

namespace tinyddp::nn {

struct ReducerOptions {
  size_t first_bucket_bytes = kDefaultFirstBucketBytes;
  size_t bucket_cap_bytes = kDefaultBucketCapBytes;
  // Parameters that got no gradient by the end of backward count as ready (instead of an error).
  bool find_unused_parameters = false;
  // Lay the buckets out again, once, in the ready order observed in the first synchronised iteration.
  bool rebuild_buckets = true;
};

class Reducer {
 public:
  // Watches the Reducer's iterations; every call comes from the thread that runs backward.
  class Observer {
   public:
    virtual ~Observer() = default;
    // prepare_for_backward(): an iteration with `buckets` buckets begins.
    virtual void iteration_started(size_t buckets) = 0;
    // The bucket's last gradient was marked ready.
    virtual void bucket_ready(size_t bucket) = 0;
    // The bucket's all-reduce was launched; `work` completes when it is done.
    virtual void bucket_launched(size_t bucket, const BucketSpec& spec, const comm::WorkPtr& work) = 0;
    // A gradient was marked ready (between layers of backward): a moment to look at the launched work.
    virtual void gradient_marked() = 0;
    // finalize() has waited for the bucket's all-reduce.
    virtual void bucket_finished(size_t bucket) = 0;
  };

  // Plans the buckets in reverse registration order, allocates their flat buffers on the parameters'
  // device, copies each current gradient into its place and rebinds param.grad to that view, and
  // hooks every parameter. The parameters must outlive the Reducer.
  Reducer(std::vector<NamedParameter> parameters, std::shared_ptr<comm::ProcessGroup> group,
          ReducerOptions options = {});
  // Unhooks the parameters. Their .grad stay views into the (still alive) bucket buffers.
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Arms the Reducer for one backward pass (DDP's forward calls it unless no_sync() is active).
  // While it is not armed, the hooks do nothing and gradients just accumulate locally.
  void prepare_for_backward();
  // The hook: parameter `index` (registration order) has its final gradient for this iteration.
  void mark_ready(size_t index);
  // End of backward: deals with parameters that were never marked, waits for every bucket's
  // all-reduce, and (once) rebuilds the buckets. Copies nothing: the gradients are the buckets.
  // Does nothing when not armed.
  void finalize();
  // Gives up on the current iteration after an error in backward: disarms, and leaves the
  // all-reduces already started to be awaited by the next prepare_for_backward().
  void abandon_iteration();

  // Replaces the default all-reduce of every bucket by `hook`, run over `group` (null: the Reducer's
  // own). Only once, and only before the first synchronised backward; throws otherwise.
  void register_comm_hook(std::shared_ptr<comm::ProcessGroup> group, CommHook hook);
  bool has_custom_comm_hook() const { return custom_hook_; }

  bool armed() const { return armed_; }
  // The current bucket layout, in launch order.
  const std::vector<BucketSpec>& buckets() const { return specs_; }
  // describe_buckets() of bucket_plan.h with this model's parameter names.
  std::string describe_buckets() const;
  bool buckets_rebuilt() const { return rebuilt_; }
  // The order gradients were marked ready in the last armed iteration (for tests and curious readers).
  const std::vector<size_t>& last_ready_order() const { return ready_order_; }
  // Synchronised iterations finished (finalize() calls that completed).
  int64_t iterations() const { return iterations_; }
  // Bucket b's flat buffer (every gradient in it is a view of this).
  const Tensor& bucket_buffer(size_t b) const;
  const std::vector<NamedParameter>& parameters() const { return parameters_; }
  comm::ProcessGroup& process_group() { return *group_; }
  // The observer of the iterations to come (nullptr: none). Shared: it may outlive the Reducer.
  void set_observer(std::shared_ptr<Observer> observer) { observer_ = std::move(observer); }

 private:
  struct Bucket {
    Tensor buffer;          // the flat buffer; every parameter's grad is a view into it
    size_t pending = 0;     // gradients still to be marked ready in this iteration
    CommHookFuture future;  // the hook's (by default: the all-reduce) of this iteration, once started
    GradBucket view;        // what the hook is given: the buffer, its parameters and their places
  };
  struct Location {
    size_t bucket = 0;
    int64_t offset = 0;  // in elements, inside the bucket's buffer
  };

  // Allocates buffers for `specs`, moves the gradients into them and rebinds param.grad.
  void install(std::vector<BucketSpec> specs);
  void mark(size_t index, bool observed);
  void launch_ready_buckets();
  CommHookFuture run_hook(size_t b);
  void wait_for_bucket(size_t b);
  void wait_for_abandoned_work();
  void rebuild_from_observed_order();
  const std::string& name(size_t index) const { return parameters_[index].name; }

  std::vector<NamedParameter> parameters_;
  std::shared_ptr<comm::ProcessGroup> group_;
  ReducerOptions options_;
  std::vector<BucketSpec> specs_;
  std::vector<Bucket> buckets_;
  std::vector<Location> locations_;  // by parameter index

  // The iteration in progress.
  bool armed_ = false;
  std::vector<bool> marked_;
  size_t next_to_launch_ = 0;
  std::vector<size_t> ready_order_;
  std::vector<comm::WorkPtr> abandoned_;  // started by an iteration that failed, not awaited yet

  int64_t iterations_ = 0;
  bool rebuilt_ = false;
  std::shared_ptr<Observer> observer_;
  CommHook hook_ = comm_hooks::allreduce;
  std::shared_ptr<comm::ProcessGroup> hook_group_;  // the hook's group when it is not group_
  bool custom_hook_ = false;
  bool backward_seen_ = false;  // a synchronised backward has marked a gradient: too late for a hook
};

}  // namespace tinyddp::nn
