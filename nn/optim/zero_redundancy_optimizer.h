// ZeroRedundancyOptimizer: ZeRO stage 1 (DeepSpeed; PyTorch's ZeroRedundancyOptimizer; llm.c's
// ZeRO-1) on top of DistributedDataParallel's buckets.
//
// Under plain DDP every rank holds the whole optimizer state (Adam: two numbers per weight, twice the
// model) and applies the same update to the same weights N times over. ZeRO-1 splits that work: each
// rank keeps the state of, and updates, only 1/N of every bucket (its shard), then the ranks share
// their updated shards. Per step and bucket:
//
//   backward   DDP's comm hook, replaced: reduce_scatter(avg) of the bucket's gradients, so each
//              rank receives only its shard's averaged gradients (half the traffic of an all-reduce)
//   step()     the wrapped optimizer (Adam, AdamW, SGD) updates this rank's shard, nothing else
//   all_gather every rank's updated shard to every rank: the other half of an all-reduce's traffic;
//              started asynchronously at the end of step(), awaited at the start of the next
//              forward (DDP's forward pre-hook), so it overlaps whatever runs in between
//
// Bytes on the wire per step are those of DDP's all-reduce (which is itself reduce-scatter +
// all-gather); the optimizer state per rank is 1/N. The weights are bitwise those of plain DDP with
// the same optimizer when DDP's all-reduce runs the ring (zero_shard.h says how the layouts agree).
//
//   DistributedDataParallel ddp(model, group);
//   nn::Adam adam(ddp.named_parameters(), 1e-3);      // only its settings are used: it never steps
//   nn::ZeroRedundancyOptimizer optimizer(ddp, adam);  // registers DDP's comm hook; before any backward
//   ... exactly as with a plain optimizer: zero_grad, forward, backward, step.
//
// What to know:
//   - After backward, param.grad holds this rank's own (unreduced) gradients: the averages exist only
//     as shards. So the checks that read averaged gradients are this object's, and collective:
//     clip_grad_norm (each rank sums the squares of its shards, one all-reduce adds the ranks' sums)
//     and gradients_finite (one all-reduce, so every rank skips the same steps).
//   - no_sync() works as with DDP: local accumulation, one reduce-scatter on the synchronised step.
//   - Checkpoints: consolidate_state_dict() (collective, every rank) gathers the state under the
//     names the unsharded optimizer uses ("exp_avg.0.weight"); then state_tensors() returns it, so
//     save_checkpoint on rank 0 writes a file a plain Adam loads. load_checkpoint into a fresh
//     ZeroRedundancyOptimizer, at any world size, cuts the file's state into this rank's shards.
//   - DDP lays its buckets out again after the first iteration (the rebuild); the shards follow
//     (their state is consolidated and cut again, once).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tinyddp/comm/process_group.h"
#include "tinyddp/nn/ddp/distributed_data_parallel.h"
#include "tinyddp/nn/optim/optimizer.h"
#include "tinyddp/nn/optim/zero_shard.h"

namespace tinyddp::nn {

// A new optimizer of `prototype`'s kind (Adam, AdamW, SGD) and settings over `params`.
std::unique_ptr<Optimizer> optimizer_like(const Optimizer& prototype, std::vector<NamedParameter> params);

class ZeroRedundancyOptimizer : public Optimizer {
 public:
  // Shards `ddp`'s buckets over its process group and registers the reduce-scatter as its comm hook
  // (so: before the first backward, and no other hook). `prototype` gives the optimizer's kind,
  // settings and lr; its own state is never created. `ddp` must outlive this object. Collective.
  ZeroRedundancyOptimizer(DistributedDataParallel& ddp, const Optimizer& prototype);
  ~ZeroRedundancyOptimizer() override;

  // Updates this rank's shards from their averaged gradients, then starts the all-gathers of the
  // updated weights. Needs a synchronised backward since the last step.
  void step() override;
  std::string kind() const override { return inner_->kind(); }
  // The consolidated state under the unsharded optimizer's names, as of the last
  // consolidate_state_dict(); before the first step, zeros of those shapes (for load_checkpoint).
  std::vector<std::pair<std::string, Tensor>> state_tensors() override;
  // load_checkpoint copied a file's state into state_tensors(): cut it into this rank's shards.
  void state_loaded() override;

  // Collective (every rank): gathers every rank's shards of the state, so that state_tensors() lists
  // the whole state (the memory of the unsharded state, until the next step frees it).
  void consolidate_state_dict();
  // clip_grad_norm (nn/optim/clip.h) over the averaged gradients of every rank's shards: the same
  // total norm and factor on every rank, computed from the shards. Collective; after a synchronised
  // backward. The norm equals plain DDP's up to the order of the additions (last bits).
  double clip_grad_norm(double max_norm);
  // Whether every averaged gradient, on every rank's shards, is finite. Collective.
  bool gradients_finite();
  // Waits for the all-gathers step() started and writes the updated weights into the parameters.
  // DDP's forward calls it; call it before reading the weights any other way.
  void wait_for_parameters();

  // The bytes of this rank's optimizer state tensors (Adam: exp_avg and exp_avg_sq of its shards).
  size_t state_bytes();
  // Elements of the flat parameters this rank owns, over all buckets.
  int64_t owned_elements() const;
  // The optimizer that steps this rank's shards (its parameters are the shards, "bucket<b>").
  Optimizer& local_optimizer() { return *inner_; }

 private:
  struct Shard {
    BucketPlaces places;
    ShardLayout layout;
    Tensor staging;  // world * slot: the reduce-scatter's input, then the all-gather's output
    Tensor reduced;  // slot: the reduce-scatter's output, this rank's averaged gradients (+ padding)
    // value: this rank's weights, a view into its slot of `staging`; grad: a view into `reduced`
    std::unique_ptr<Parameter> owned;
    comm::WorkPtr all_gather;  // pending after step()
  };
  // The state by key ("exp_avg") and parameter (registration order), unsharded.
  using FullState = std::vector<std::pair<std::string, std::vector<Tensor>>>;

  CommHook make_comm_hook();
  // The sum over every rank's shards of their averaged gradients squared (an all-reduce of the ranks' sums).
  double global_sum_of_squares(const char* caller);
  CommHookFuture reduce_scatter(comm::ProcessGroup& group, GradBucket& bucket);
  void build_shards();
  bool shards_match_buckets() const;
  void follow_rebuilt_buckets();
  std::vector<Tensor> parameter_values(const Shard& shard) const;
  FullState gather_full_state();
  void scatter_full_state(const FullState& full);
  // The inner optimizer's state tensors, by key and then by shard.
  std::vector<std::pair<std::string, std::vector<Tensor>>> shard_state();

  DistributedDataParallel& ddp_;
  std::shared_ptr<comm::ProcessGroup> group_;
  std::unique_ptr<Optimizer> prototype_;  // an empty copy of the prototype's settings, for new shards
  std::vector<Shard> shards_;
  std::unique_ptr<Optimizer> inner_;
  bool gradients_reduced_ = false;  // a synchronised backward ran since the last step
  FullState consolidated_;
  int64_t consolidated_step_ = -1;
  int forward_hook_id_ = -1;
  std::shared_ptr<ZeroRedundancyOptimizer*> self_;  // what the comm hook reaches this object through
};

}  // namespace tinyddp::nn
