#include "tinyddp/nn/ddp/reducer.h"

#include <algorithm>
#include <set>
#include <utility>

#include "tinyddp/core/error.h"
#include "tinyddp/core/log.h"
#include "tinyddp/core/short_list.h"

namespace tinyddp::nn {

namespace {

// The hook the Reducer adds to each Parameter. A named type (rather than a lambda) so the destructor
// can find its own hooks among the parameter's others and remove exactly those.
struct ReadyHook {
  Reducer* reducer;
  size_t index;
  void operator()(Parameter&) const { reducer->mark_ready(index); }
};

// TINYDDP_DEBUG=INFO (or DETAIL, which includes it) prints the bucket layout, as
// TORCH_DISTRIBUTED_DEBUG=INFO makes PyTorch's DDP log its buckets.
bool debug_info_enabled() { return debug_level() >= DebugLevel::info; }

// describe_buckets() without its final newline, for one log message.
std::string trimmed(std::string text) {
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

std::string list_names(const std::vector<NamedParameter>& parameters, const std::vector<size_t>& indices) {
  return short_list(indices, 5, [&](size_t i) { return in_quotes(parameters[i].name); });
}

}  // namespace

Reducer::Reducer(std::vector<NamedParameter> parameters, std::shared_ptr<comm::ProcessGroup> group,
                 ReducerOptions options)
    : parameters_(std::move(parameters)), group_(std::move(group)), options_(options) {
  TINYDDP_CHECK(group_ != nullptr, "Reducer: the process group is null",
                hint("create one with "
                     "comm::create_process_group (or rendezvous) first"));
  TINYDDP_CHECK(!parameters_.empty(),
                "Reducer: the model has no parameters, so there are no gradients to "
                "synchronise",
                hint("DistributedDataParallel is only needed for models with parameters"));
  const Device device = parameters_[0].parameter->value.device();
  std::set<const Parameter*> distinct;
  for (const NamedParameter& named : parameters_) {
    TINYDDP_CHECK(named.parameter != nullptr, "Reducer: parameter '", named.name, "' is null",
                  hint("pass "
                       "module.named_parameters()"));
    const Tensor& value = named.parameter->value;
    TINYDDP_CHECK(value.device() == device, "Reducer: parameter '", named.name, "' is on ", value.device().str(),
                  " but '", parameters_[0].name, "' is on ", device.str(),
                  hint("move the whole model to one device "
                       "with model.to(device) before wrapping it in DistributedDataParallel"));
    TINYDDP_CHECK(value.dtype() == DType::f32, "Reducer: parameter '", named.name, "' is ", value.describe(),
                  hint("parameters must be f32"));
    TINYDDP_CHECK(distinct.insert(named.parameter).second, "Reducer: parameter '", named.name,
                  "' is listed twice "
                  "(a shared weight)",
                  hint("list every Parameter once, a shared one under a single name"));
    const Tensor& grad = named.parameter->grad;
    TINYDDP_CHECK(!grad.defined() || (grad.shape() == value.shape() && grad.dtype() == value.dtype()),
                  "Reducer: the gradient of '", named.name, "' is ", grad.describe(), " but the parameter is ",
                  value.describe(), hint("gradients must have their parameter's shape and dtype"));
  }

  std::vector<size_t> bytes;
  for (const NamedParameter& named : parameters_) bytes.push_back(named.parameter->value.nbytes());
  install(plan_buckets(reverse_registration_order(parameters_.size()), bytes, options_.first_bucket_bytes,
                       options_.bucket_cap_bytes));
  for (size_t i = 0; i < parameters_.size(); ++i)
    parameters_[i].parameter->grad_ready_hooks.push_back(ReadyHook{this, i});

  if (debug_info_enabled() && group_->rank() == 0)
    log_line(LogLevel::info, "ddp",
             "buckets in reverse registration order (rebuilt after the first "
             "iteration):\n" +
                 trimmed(describe_buckets()));
}

Reducer::~Reducer() {
  for (NamedParameter& named : parameters_) {
    auto& hooks = named.parameter->grad_ready_hooks;
    std::erase_if(hooks, [this](const std::function<void(Parameter&)>& hook) {
      const ReadyHook* mine = hook.target<ReadyHook>();
      return mine != nullptr && mine->reducer == this;
    });
  }
  // An all-reduce still running writes into the gradients; let it finish before the Reducer goes.
  if (armed_) abandon_iteration();
  wait_for_abandoned_work();
}

void Reducer::install(std::vector<BucketSpec> specs) {
  const Device device = parameters_[0].parameter->value.device();
  std::vector<Bucket> buckets(specs.size());
  std::vector<Location> locations(parameters_.size());
  for (size_t b = 0; b < specs.size(); ++b) {
    int64_t elements = 0;
    for (size_t index : specs[b].parameters) elements += parameters_[index].parameter->value.numel();
    // CPU buckets live in symmetric memory where the group has it (its ranks share a host): the
    // all-reduce then reads the peers' gradients where they lie (comm/symmetric/). Every rank
    // installs the same buckets in the same order, as allocate_symmetric requires.
    if (device.is_cpu()) {
      buckets[b].buffer = group_->allocate_symmetric({elements}, DType::f32);
      buckets[b].buffer.zero_();
    } else {
      buckets[b].buffer = Tensor::zeros({elements}, DType::f32, device);
    }
    GradBucket& view = buckets[b].view;
    view.index = b;
    view.last = b + 1 == specs.size();
    view.buffer = buckets[b].buffer;
    view.parameters = specs[b].parameters;
    int64_t offset = 0;
    for (size_t index : specs[b].parameters) {
      view.offsets.push_back(offset);
      view.lengths.push_back(parameters_[index].parameter->value.numel());
      Parameter& p = *parameters_[index].parameter;
      Tensor view = buckets[b].buffer.view(offset, p.value.shape());
      // Keep whatever the gradient holds (a gradient accumulated before wrapping, or before a
      // rebuild), then make the view *the* gradient: from now on backward writes into the bucket.
      // A gradient that is "none" (has_grad false) has nothing worth keeping.
      if (p.grad.defined() && p.has_grad) view.copy_from(p.grad);
      p.grad = view;
      locations[index] = {b, offset};
      offset += p.value.numel();
    }
  }
  specs_ = std::move(specs);
  buckets_ = std::move(buckets);
  locations_ = std::move(locations);
}

void Reducer::prepare_for_backward() {
  if (armed_) abandon_iteration();  // a forward without its backward: start over
  wait_for_abandoned_work();
  for (size_t b = 0; b < buckets_.size(); ++b) {
    buckets_[b].pending = specs_[b].parameters.size();
    buckets_[b].future = {};
  }
  marked_.assign(parameters_.size(), false);
  ready_order_.clear();
  next_to_launch_ = 0;
  armed_ = true;
  if (observer_) observer_->iteration_started(buckets_.size());
}

void Reducer::mark_ready(size_t index) {
  if (!armed_) return;  // no_sync(), or a backward that DDP's forward did not prepare
  TINYDDP_CHECK(index < parameters_.size(), "Reducer::mark_ready: parameter index ", index, " is outside the ",
                parameters_.size(), " parameters", hint("mark_ready is called by the parameters' own hooks"));
  mark(index, true);
}

void Reducer::mark(size_t index, bool observed) {
  TINYDDP_CHECK(!marked_[index], "DistributedDataParallel: parameter '", name(index),
                "' was marked ready twice in "
                "one backward pass on rank ",
                group_->rank(),
                "; its bucket may already be on the wire, so the second "
                "gradient cannot be included",
                hint("use each layer once per forward pass, or run the extra "
                     "backward passes of gradient accumulation under no_sync()"));
  marked_[index] = true;
  backward_seen_ = true;
  if (observed) ready_order_.push_back(index);
  const size_t b = locations_[index].bucket;
  if (--buckets_[b].pending == 0) {
    if (observer_) observer_->bucket_ready(b);
    launch_ready_buckets();
  }
  if (observer_) observer_->gradient_marked();
}

void Reducer::launch_ready_buckets() {
  // Strictly in bucket order: bucket 3 may be complete before bucket 2 (gradients need not become
  // ready in the planned order), but it waits for bucket 2 to start first, because every rank must
  // issue its collectives in the same sequence.
  while (next_to_launch_ < buckets_.size() && buckets_[next_to_launch_].pending == 0) {
    Bucket& bucket = buckets_[next_to_launch_];
    // By default: avg = sum over the ranks, then one division by the world size (in the backend,
    // after the sum). The bucket's index travels with the call, so a hung all-reduce is named by its
    // bucket too.
    bucket.future = run_hook(next_to_launch_);
    if (observer_) observer_->bucket_launched(next_to_launch_, specs_[next_to_launch_], bucket.future.work());
    ++next_to_launch_;
  }
}

CommHookFuture Reducer::run_hook(size_t b) {
  comm::ProcessGroup& group = hook_group_ ? *hook_group_ : *group_;
  if (!custom_hook_) return hook_(group, buckets_[b].view);
  CommHookFuture future;
  try {
    future = hook_(group, buckets_[b].view);
  } catch (const std::exception& e) {
    const auto* error = dynamic_cast<const Error*>(&e);
    TINYDDP_FAIL("DistributedDataParallel: the comm hook failed on bucket ", b, " (", specs_[b].parameters.size(),
                 " parameter(s): ", list_names(parameters_, specs_[b].parameters), ") on rank ", group_->rank(), ": ",
                 error ? error->message() : std::string(e.what()));
  }
  TINYDDP_CHECK(future.valid(), "DistributedDataParallel: the comm hook returned an empty future for bucket ", b,
                " on rank ", group_->rank(),
                hint("return CommHookFuture(work) with the Work of the collective "
                     "the hook started"));
  return future;
}

void Reducer::wait_for_bucket(size_t b) {
  if (!custom_hook_) return buckets_[b].future.wait();
  try {
    buckets_[b].future.wait();
  } catch (const std::exception& e) {
    const auto* error = dynamic_cast<const Error*>(&e);
    TINYDDP_FAIL("DistributedDataParallel: the comm hook's future failed for bucket ", b, " (",
                 list_names(parameters_, specs_[b].parameters), ") on rank ", group_->rank(), ": ",
                 error ? error->message() : std::string(e.what()));
  }
}

void Reducer::register_comm_hook(std::shared_ptr<comm::ProcessGroup> group, CommHook hook) {
  TINYDDP_CHECK(hook != nullptr, "DistributedDataParallel::register_comm_hook: the hook is empty",
                hint("pass a "
                     "function (ProcessGroup&, GradBucket&) -> CommHookFuture, e.g. nn::comm_hooks::allreduce"));
  TINYDDP_CHECK(!custom_hook_, "DistributedDataParallel::register_comm_hook: a comm hook is already registered",
                hint("register_comm_hook may be called only once (as in PyTorch); do everything in one hook"));
  TINYDDP_CHECK(!backward_seen_ && iterations_ == 0,
                "DistributedDataParallel::register_comm_hook: called after "
                "a synchronised backward pass already ran",
                hint("register the hook right after wrapping the model, "
                     "before the first backward (every rank at the same point)"));
  TINYDDP_CHECK(!group || group->size() == group_->size(),
                "DistributedDataParallel::register_comm_hook: the hook's "
                "process group has ",
                group ? group->size() : 0, " ranks but DDP's has ", group_->size(),
                hint("pass nullptr to use DDP's own group"));
  hook_ = std::move(hook);
  hook_group_ = std::move(group);
  custom_hook_ = true;
}

void Reducer::finalize() {
  if (!armed_) return;
  std::vector<size_t> missing;
  for (size_t i = 0; i < parameters_.size(); ++i)
    if (!marked_[i]) missing.push_back(i);
  if (!missing.empty()) {
    if (!options_.find_unused_parameters) {
      abandon_iteration();
      TINYDDP_FAIL("DistributedDataParallel: ", missing.size(),
                   " parameter(s) got no gradient in this backward pass "
                   "on rank ",
                   group_->rank(), ": ", list_names(parameters_, missing),
                   "; their buckets could not be "
                   "all-reduced",
                   hint("pass find_unused_parameters = true when some layers do not run in every "
                        "iteration, or make every parameter take part in the loss"));
    }
    // Unused here: this rank contributes what backward accumulated for them in this iteration, which
    // is nothing new; the all-reduce still runs, since other ranks may have used them. A parameter
    // with no gradient at all (zero_grad set it to none) holds stale numbers in its part of the
    // bucket: it contributes zeros instead, as PyTorch's reducer zero-fills the bucket view of a
    // gradient that is None, and afterwards holds the average like every other parameter.
    for (size_t index : missing) {
      Parameter& p = *parameters_[index].parameter;
      if (!p.has_grad) {
        p.grad.zero_();
        p.has_grad = true;
      }
      mark(index, false);
    }
  }
  TINYDDP_CHECK(next_to_launch_ == buckets_.size(), "Reducer::finalize: only ", next_to_launch_, " of ",
                buckets_.size(), " buckets started although every gradient is ready", hint("this is a bug in tinyddp"));
  for (size_t b = 0; b < buckets_.size(); ++b) {
    try {
      wait_for_bucket(b);
    } catch (...) {
      abandon_iteration();
      throw;
    }
    if (observer_) observer_->bucket_finished(b);
  }
  for (Bucket& bucket : buckets_) bucket.future = {};
  armed_ = false;
  ++iterations_;
  if (options_.rebuild_buckets && !options_.find_unused_parameters && !rebuilt_) rebuild_from_observed_order();
}

void Reducer::abandon_iteration() {
  for (Bucket& bucket : buckets_) {
    if (bucket.future.valid()) abandoned_.push_back(bucket.future.work());
    bucket.future = {};
  }
  armed_ = false;
}

void Reducer::wait_for_abandoned_work() {
  for (const comm::WorkPtr& work : abandoned_) {
    try {
      work->wait();
    } catch (...) {
      // Already reported to whoever ran that iteration (or the group is aborted, and the next
      // collective says so); all that matters here is that nothing writes into the buckets any more.
    }
  }
  abandoned_.clear();
}

void Reducer::rebuild_from_observed_order() {
  rebuilt_ = true;
  // Every parameter was marked (finalize would have thrown otherwise), so the order is complete on
  // every rank and every rank takes part in the broadcast below.
  TINYDDP_CHECK(ready_order_.size() == parameters_.size(), "Reducer: the observed ready order lists ",
                ready_order_.size(), " of ", parameters_.size(), " parameters", hint("this is a bug in tinyddp"));
  // Ranks may have seen slightly different orders; rank 0's is broadcast so that every rank lays out
  // the same buckets (otherwise the all-reduces would add up unrelated gradients).
  std::vector<int64_t> order(ready_order_.begin(), ready_order_.end());
  Tensor agreed = Tensor::from_vector(order).to(parameters_[0].parameter->value.device());  // the group's device
  group_->broadcast(agreed, 0)->wait();
  std::vector<size_t> agreed_order;
  for (int64_t index : agreed.to_vector<int64_t>()) agreed_order.push_back(size_t(index));
  std::vector<size_t> bytes;
  for (const NamedParameter& named : parameters_) bytes.push_back(named.parameter->value.nbytes());
  std::vector<BucketSpec> specs = plan_buckets(agreed_order, bytes, options_.first_bucket_bytes,
                                               options_.bucket_cap_bytes);
  bool same = specs.size() == specs_.size();
  for (size_t b = 0; same && b < specs.size(); ++b) same = specs[b].parameters == specs_[b].parameters;
  if (!same) install(std::move(specs));  // the gradients just averaged move into the new buffers
  if (debug_info_enabled() && group_->rank() == 0)
    log_line(LogLevel::info, "ddp",
             std::string(same ? "buckets kept" : "buckets rebuilt") + " in the ready order of the first iteration:\n" +
                 trimmed(describe_buckets()));
}

std::string Reducer::describe_buckets() const {
  std::vector<std::string> names;
  for (const NamedParameter& named : parameters_) names.push_back(named.name);
  return nn::describe_buckets(specs_, names);
}

const Tensor& Reducer::bucket_buffer(size_t b) const {
  TINYDDP_CHECK(b < buckets_.size(), "Reducer::bucket_buffer(", b, "): there are ", buckets_.size(), " buckets",
                hint("bucket indices start at 0"));
  return buckets_[b].buffer;
}

}  // namespace tinyddp::nn
