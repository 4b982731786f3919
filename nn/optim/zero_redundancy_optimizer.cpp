#include "tinyddp/nn/optim/zero_redundancy_optimizer.h"

#include <cmath>
#include <utility>

#include "tinyddp/core/error.h"
#include "tinyddp/kernels/ops.h"
#include "tinyddp/nn/optim/adam.h"
#include "tinyddp/nn/optim/sgd.h"

namespace tinyddp::nn {

namespace {

std::string shard_name(size_t bucket) { return "bucket" + std::to_string(bucket); }

}  // namespace

std::unique_ptr<Optimizer> optimizer_like(const Optimizer& prototype, std::vector<NamedParameter> params) {
  // AdamW before Adam: it is one.
  if (const auto* adamw = dynamic_cast<const AdamW*>(&prototype))
    return std::make_unique<AdamW>(std::move(params), adamw->lr(), adamw->betas(), adamw->eps(), adamw->weight_decay());
  if (const auto* adam = dynamic_cast<const Adam*>(&prototype))
    return std::make_unique<Adam>(std::move(params), adam->lr(), adam->betas(), adam->eps(), adam->weight_decay());
  if (const auto* sgd = dynamic_cast<const SGD*>(&prototype))
    return std::make_unique<SGD>(std::move(params), sgd->lr(), sgd->momentum(), sgd->dampening(), sgd->weight_decay(),
                                 sgd->nesterov());
  TINYDDP_FAIL("ZeroRedundancyOptimizer: cannot shard a \"", prototype.kind(), "\" optimizer",
               hint("wrap an Adam, "
                    "AdamW or SGD (their updates are element by element, so a shard steps exactly like the whole)"));
}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(DistributedDataParallel& ddp, const Optimizer& prototype)
    : Optimizer(ddp.named_parameters(), prototype.lr()),
      ddp_(ddp),
      group_(ddp.process_group_ptr()),
      prototype_(optimizer_like(prototype, ddp.named_parameters())),
      self_(std::make_shared<ZeroRedundancyOptimizer*>(this)) {
  TINYDDP_CHECK(prototype.step_count() == 0, "ZeroRedundancyOptimizer: the ", prototype.kind(),
                " given has already "
                "taken ",
                prototype.step_count(), " steps",
                hint("pass a fresh optimizer (only its settings are used); "
                     "to continue a run, load its checkpoint into the ZeroRedundancyOptimizer"));
  initial_lr_ = prototype.initial_lr();
  build_shards();
  ddp_.register_comm_hook(group_, make_comm_hook());
  forward_hook_id_ = ddp_.add_forward_pre_hook([this] { wait_for_parameters(); });
}

ZeroRedundancyOptimizer::~ZeroRedundancyOptimizer() {
  *self_ = nullptr;
  ddp_.remove_forward_pre_hook(forward_hook_id_);
  for (Shard& shard : shards_) {
    if (!shard.all_gather) continue;
    try {
      shard.all_gather->wait();  // nothing may still write into the staging buffers
    } catch (...) {
      // The group failed; whoever uses it next is told so.
    }
  }
}

CommHook ZeroRedundancyOptimizer::make_comm_hook() {
  // The hook stays with DDP; through self_ it notices this object is gone instead of using it.
  return [self = self_](comm::ProcessGroup& group, GradBucket& bucket) {
    TINYDDP_CHECK(*self != nullptr,
                  "ZeroRedundancyOptimizer: DDP's comm hook belongs to a ZeroRedundancyOptimizer "
                  "that was destroyed",
                  hint("keep the ZeroRedundancyOptimizer alive as long as the model trains"));
    return (*self)->reduce_scatter(group, bucket);
  };
}

void ZeroRedundancyOptimizer::build_shards() {
  const Reducer& reducer = ddp_.reducer();
  const int world = group_->size(), rank = group_->rank();
  std::vector<Shard> shards(reducer.buckets().size());
  std::vector<NamedParameter> owned;
  for (size_t b = 0; b < shards.size(); ++b) {
    Shard& shard = shards[b];
    const Tensor& buffer = reducer.bucket_buffer(b);
    int64_t offset = 0;
    for (size_t index : reducer.buckets()[b].parameters) {
      const int64_t length = reducer.parameters()[index].parameter->value.numel();
      shard.places.parameters.push_back(index);
      shard.places.offsets.push_back(offset);
      shard.places.lengths.push_back(length);
      offset += length;
    }
    shard.layout = shard_layout(buffer.numel(), world, rank);
    // Zeros: the padding of every slot must stay zero through the sums. On the CPU the staging buffer
    // lives in symmetric memory where the group has it (its ranks share a host), as DDP's buckets do:
    // the reduce-scatter then reads the peers' slots where they lie, and the all-gather writes this
    // rank's weights straight into every peer's buffer. Every rank builds the same shards in the same
    // order, as allocate_symmetric requires.
    if (buffer.device().is_cpu()) {
      shard.staging = group_->allocate_symmetric({shard.layout.slot * world}, DType::f32);
      shard.staging.zero_();
    } else {
      shard.staging = Tensor::zeros({shard.layout.slot * world}, DType::f32, buffer.device());
    }
    shard.reduced = Tensor::zeros({shard.layout.slot}, DType::f32, buffer.device());
    shard.owned = std::make_unique<Parameter>();
    // The weights to step live in this rank's own slot of the staging buffer: the reduce-scatter has
    // consumed it by then, and the all-gather sends them from there without a copy.
    shard.owned->value = shard.staging.view(rank * shard.layout.slot, {shard.layout.length});
    shard.owned->grad = shard.reduced.view(0, {shard.layout.length});
    owned.push_back({shard_name(b), shard.owned.get()});
  }
  shards_ = std::move(shards);
  inner_ = optimizer_like(*prototype_, std::move(owned));
}

bool ZeroRedundancyOptimizer::shards_match_buckets() const {
  const auto& buckets = ddp_.reducer().buckets();
  if (buckets.size() != shards_.size()) return false;
  for (size_t b = 0; b < buckets.size(); ++b)
    if (buckets[b].parameters != shards_[b].places.parameters) return false;
  return true;
}

void ZeroRedundancyOptimizer::follow_rebuilt_buckets() {
  // Every rank sees the same rebuilt layout (DDP agrees on it), so every rank gets here at the same
  // bucket of the same iteration and the collectives below match.
  FullState full = gather_full_state();
  build_shards();
  scatter_full_state(full);
}

CommHookFuture ZeroRedundancyOptimizer::reduce_scatter(comm::ProcessGroup& group, GradBucket& bucket) {
  if (bucket.index == 0) {
    wait_for_parameters();  // the staging buffers are the all-gathers' outputs until then
    if (!shards_match_buckets()) follow_rebuilt_buckets();
  }
  TINYDDP_CHECK(bucket.index < shards_.size() && bucket.buffer.numel() == shards_[bucket.index].layout.count,
                "ZeroRedundancyOptimizer: bucket ", bucket.index, " (", bucket.buffer.numel(),
                " elements) does not "
                "match the shards laid out for DDP's buckets",
                hint("this is a bug in tinyddp"));
  Shard& shard = shards_[bucket.index];
  pack_slots(shard.layout, bucket.buffer, shard.staging);
  gradients_reduced_ = true;
  return CommHookFuture(group.reduce_scatter(shard.reduced, shard.staging, comm::ReduceOp::avg, bucket.call_options()));
}

double ZeroRedundancyOptimizer::global_sum_of_squares(const char* caller) {
  TINYDDP_CHECK(gradients_reduced_, "ZeroRedundancyOptimizer::", caller,
                ": no synchronised backward ran since the "
                "last step, so the shards hold no averaged gradients",
                hint("call it between backward and step"));
  double mine = 0;
  for (const Shard& shard : shards_) mine += kernels::sum_of_squares(shard.owned->grad);  // padding is zeros
  Tensor sum = Tensor::from_vector(std::vector<double>{mine});
  if (!shards_.empty()) sum = sum.to(shards_.front().reduced.device());
  group_->all_reduce(sum, comm::ReduceOp::sum)->wait();
  return sum.to_vector<double>()[0];
}

double ZeroRedundancyOptimizer::clip_grad_norm(double max_norm) {
  TINYDDP_CHECK(max_norm >= 0, "ZeroRedundancyOptimizer::clip_grad_norm: max_norm is ", max_norm,
                hint("use a max_norm >= 0"));
  const double total = std::sqrt(global_sum_of_squares("clip_grad_norm"));
  const double factor = max_norm / (total + 1e-6);  // clip.h's formula, PyTorch's
  if (factor < 1)
    for (Shard& shard : shards_) kernels::scale(shard.owned->grad, float(factor));
  return total;
}

bool ZeroRedundancyOptimizer::gradients_finite() { return std::isfinite(global_sum_of_squares("gradients_finite")); }

std::vector<Tensor> ZeroRedundancyOptimizer::parameter_values(const Shard& shard) const {
  std::vector<Tensor> values;
  for (size_t index : shard.places.parameters) values.push_back(params_[index].parameter->value);
  return values;
}

void ZeroRedundancyOptimizer::step() {
  wait_for_parameters();
  TINYDDP_CHECK(gradients_reduced_,
                "ZeroRedundancyOptimizer::step: no synchronised backward ran since the last "
                "step, so this rank has no averaged gradients for its shards",
                hint("run forward and backward "
                     "through the DistributedDataParallel (outside no_sync()) before each step"));
  for (Shard& shard : shards_) {
    // The shard's weights are read from the parameters each step, so whatever wrote the parameters
    // (load_model, the broadcast of rank 0's weights) is what gets updated.
    copy_flat_range(shard.places, shard.layout.begin, shard.owned->value, parameter_values(shard), true);
    shard.owned->has_grad = true;
  }
  inner_->set_lr(lr_);
  inner_->set_step_count(step_count_);
  inner_->step();
  ++step_count_;
  gradients_reduced_ = false;
  consolidated_.clear();  // stale now: free its memory
  consolidated_step_ = -1;
  const int rank = group_->rank();
  for (size_t b = 0; b < shards_.size(); ++b) {
    Shard& shard = shards_[b];
    Tensor mine = shard.staging.view(rank * shard.layout.slot, {shard.layout.slot});  // holds owned->value
    comm::CallOptions call;
    call.bucket = int(b);
    shard.all_gather = group_->all_gather(shard.staging, mine, call);
  }
}

void ZeroRedundancyOptimizer::wait_for_parameters() {
  for (Shard& shard : shards_) {
    if (!shard.all_gather) continue;
    comm::WorkPtr work = std::move(shard.all_gather);
    shard.all_gather = nullptr;
    work->wait();
    unpack_slots(shard.layout, shard.places, shard.staging, parameter_values(shard));
  }
}

std::vector<std::pair<std::string, std::vector<Tensor>>> ZeroRedundancyOptimizer::shard_state() {
  // The inner optimizer names its state "<key>.bucket<b>".
  std::vector<std::pair<std::string, std::vector<Tensor>>> by_key;
  for (auto& [name, tensor] : inner_->state_tensors()) {
    const std::string key = name.substr(0, name.rfind(".bucket"));
    auto it = by_key.begin();
    while (it != by_key.end() && it->first != key) ++it;
    if (it == by_key.end()) it = by_key.insert(by_key.end(), {key, {}});
    it->second.push_back(tensor);
  }
  return by_key;
}

ZeroRedundancyOptimizer::FullState ZeroRedundancyOptimizer::gather_full_state() {
  wait_for_parameters();
  FullState full;
  const int rank = group_->rank();
  for (auto& [key, shard_tensors] : shard_state()) {
    std::vector<Tensor> per_parameter;
    for (const NamedParameter& p : params_) {
      const Tensor& value = p.parameter->value;
      per_parameter.push_back(Tensor::zeros(value.shape(), DType::f32, value.device()));
    }
    for (size_t b = 0; b < shards_.size(); ++b) {
      const Shard& shard = shards_[b];
      Tensor gathered = Tensor::zeros(shard.staging.shape(), DType::f32, shard.staging.device());
      Tensor mine = gathered.view(rank * shard.layout.slot, {shard.layout.slot});
      if (shard.layout.length > 0) mine.view(0, {shard.layout.length}).copy_from(shard_tensors[b]);
      group_->all_gather(gathered, mine)->wait();
      std::vector<Tensor> targets;
      for (size_t index : shard.places.parameters) targets.push_back(per_parameter[index]);
      unpack_slots(shard.layout, shard.places, gathered, targets);
    }
    full.emplace_back(key, std::move(per_parameter));
  }
  return full;
}

void ZeroRedundancyOptimizer::scatter_full_state(const FullState& full) {
  auto local = shard_state();
  TINYDDP_CHECK(local.size() == full.size(), "ZeroRedundancyOptimizer: ", full.size(), " kinds of state given, the ",
                inner_->kind(), " optimizer has ", local.size(), hint("load the state of the same optimizer kind"));
  for (size_t k = 0; k < local.size(); ++k) {
    TINYDDP_CHECK(local[k].first == full[k].first, "ZeroRedundancyOptimizer: state '", full[k].first, "' given where '",
                  local[k].first, "' was expected", hint("load the state of the same optimizer kind"));
    for (size_t b = 0; b < shards_.size(); ++b) {
      std::vector<Tensor> sources;
      for (size_t index : shards_[b].places.parameters) sources.push_back(full[k].second[index]);
      copy_flat_range(shards_[b].places, shards_[b].layout.begin, local[k].second[b], sources, true);
    }
  }
}

void ZeroRedundancyOptimizer::consolidate_state_dict() {
  consolidated_ = gather_full_state();
  consolidated_step_ = step_count_;
}

std::vector<std::pair<std::string, Tensor>> ZeroRedundancyOptimizer::state_tensors() {
  if (consolidated_step_ != step_count_) {
    TINYDDP_CHECK(step_count_ == 0,
                  "ZeroRedundancyOptimizer::state_tensors: the state is sharded over the ranks and "
                  "was not consolidated since step ",
                  step_count_,
                  hint("call consolidate_state_dict() on every "
                       "rank first (save_checkpoint on rank 0 after it)"));
    // Before the first step every state is zero: no collective is needed to know it.
    consolidated_.clear();
    for (auto& [key, shard_tensors] : shard_state()) {
      std::vector<Tensor> per_parameter;
      for (const NamedParameter& p : params_)
        per_parameter.push_back(Tensor::zeros(p.parameter->value.shape(), DType::f32, p.parameter->value.device()));
      consolidated_.emplace_back(key, std::move(per_parameter));
    }
    consolidated_step_ = 0;
  }
  // The unsharded optimizer's order: parameter by parameter, its keys in order.
  std::vector<std::pair<std::string, Tensor>> named;
  for (size_t i = 0; i < params_.size(); ++i)
    for (const auto& [key, per_parameter] : consolidated_)
      named.emplace_back(key + "." + params_[i].name, per_parameter[i]);
  return named;
}

void ZeroRedundancyOptimizer::state_loaded() {
  TINYDDP_CHECK(!consolidated_.empty() || shard_state().empty(),
                "ZeroRedundancyOptimizer::state_loaded: no state "
                "was handed out to load into",
                hint("load_checkpoint calls this after filling state_tensors()"));
  scatter_full_state(consolidated_);
  consolidated_.clear();
  consolidated_step_ = -1;
}

size_t ZeroRedundancyOptimizer::state_bytes() {
  size_t bytes = 0;
  for (auto& [name, tensor] : inner_->state_tensors()) bytes += tensor.nbytes();
  return bytes;
}

int64_t ZeroRedundancyOptimizer::owned_elements() const {
  int64_t elements = 0;
  for (const Shard& shard : shards_) elements += shard.layout.length;
  return elements;
}

}  // namespace tinyddp::nn
