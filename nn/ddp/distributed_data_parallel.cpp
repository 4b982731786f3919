#include "tinyddp/nn/ddp/distributed_data_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <utility>

#include "tinyddp/core/error.h"
#include "tinyddp/core/trace.h"
#include "tinyddp/nn/ddp/bucket_timeline.h"

namespace tinyddp::nn {

namespace {

size_t mebibytes_to_bytes(double mb, const char* option) {
  TINYDDP_CHECK(std::isfinite(mb) && mb > 0, "DistributedDataParallel: ", option, " is ", mb,
                hint("pass a positive size in MiB (PyTorch's default bucket_cap_mb is 25)"));
  // int(mb * 1024 * 1024), as PyTorch turns bucket_cap_mb into bytes.
  return std::max<size_t>(1, size_t(mb * 1024.0 * 1024.0));
}

// One line per parameter: what every rank must agree on.
std::vector<std::string> describe_parameters(const std::vector<NamedParameter>& parameters) {
  std::vector<std::string> lines;
  for (const NamedParameter& named : parameters) {
    const Tensor& value = named.parameter->value;
    lines.push_back("'" + named.name + "' " + dtype_name(value.dtype()) + shape_str(value.shape()));
  }
  return lines;
}

// Every rank's `text`, in rank order. Two all-gathers: the lengths, then the bytes packed eight to
// an i64 (collectives move numbers; these numbers are never added, only copied). The tensors live on
// `device`, the model's: the nccl backend moves nothing else.
std::vector<std::string> all_gather_strings(comm::ProcessGroup& group, const std::string& text, Device device) {
  const int world = group.size();
  Tensor length = Tensor::from_vector<int64_t>({int64_t(text.size())}).to(device);
  Tensor lengths = Tensor::empty({world}, DType::i64, device);
  group.all_gather(lengths, length)->wait();
  std::vector<int64_t> sizes = lengths.to_vector<int64_t>();  // (to_vector copies from any device)
  const int64_t longest = *std::max_element(sizes.begin(), sizes.end());
  const int64_t words = std::max<int64_t>(1, (longest + 7) / 8);
  Tensor mine = Tensor::zeros({words}, DType::i64);
  std::memcpy(mine.raw_data(), text.data(), text.size());
  Tensor all = Tensor::empty({int64_t(world) * words}, DType::i64, device);
  group.all_gather(all, mine.to(device))->wait();
  all = all.to(Device::cpu());
  std::vector<std::string> out;
  const char* bytes = static_cast<const char*>(all.raw_data());
  for (int r = 0; r < world; ++r) out.emplace_back(bytes + size_t(r) * size_t(words) * 8, size_t(sizes[size_t(r)]));
  return out;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(Module& module, std::shared_ptr<comm::ProcessGroup> group,
                                                 DdpOptions options)
    : module_(&module), group_(std::move(group)), options_(options) {
  initialize();
}

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<Module> module,
                                                 std::shared_ptr<comm::ProcessGroup> group, DdpOptions options)
    : owned_(std::move(module)), module_(owned_.get()), group_(std::move(group)), options_(options) {
  TINYDDP_CHECK(module_ != nullptr, "DistributedDataParallel: the module is null", hint("pass the model to wrap"));
  initialize();
}

DistributedDataParallel::~DistributedDataParallel() = default;

void DistributedDataParallel::initialize() {
  TINYDDP_CHECK(group_ != nullptr, "DistributedDataParallel: the process group is null",
                hint("create one with "
                     "comm::create_process_group (or rendezvous) before wrapping the model"));
  device_ = module_->device();
  ReducerOptions reducer_options;
  reducer_options.first_bucket_bytes = mebibytes_to_bytes(options_.first_bucket_mb, "first_bucket_mb");
  reducer_options.bucket_cap_bytes = mebibytes_to_bytes(options_.bucket_cap_mb, "bucket_cap_mb");
  reducer_options.find_unused_parameters = options_.find_unused_parameters;
  reducer_options.rebuild_buckets = options_.rebuild_buckets;
  TINYDDP_CHECK(!module_->named_parameters().empty(), "DistributedDataParallel: ", module_->describe(),
                " has no parameters, so there are no gradients to synchronise",
                hint("DDP is only needed for "
                     "models with parameters"));
  check_replicas_match();
  if (options_.broadcast_parameters) broadcast_parameters();
  reducer_ = std::make_unique<Reducer>(module_->named_parameters(), group_, reducer_options);
  // The buckets on the trace's communication lane, whenever tracing is on (TINYDDP_TRACE).
  reducer_->set_observer(std::make_shared<BucketTimeline>(group_->rank()));
}

void DistributedDataParallel::check_replicas_match() {
  std::ostringstream text;
  for (const std::string& line : describe_parameters(module_->named_parameters())) text << line << '\n';
  // Every rank gathers every rank's list and runs the same comparison, so every rank throws the same
  // error (no rank goes on to wait for a peer that is about to fail).
  std::vector<std::string> all = all_gather_strings(*group_, text.str(), device_);
  const std::vector<std::string> reference = split_lines(all[0]);
  for (size_t r = 1; r < all.size(); ++r) {
    const std::vector<std::string> lines = split_lines(all[r]);
    for (size_t i = 0; i < std::max(lines.size(), reference.size()); ++i) {
      if (i < lines.size() && i < reference.size() && lines[i] == reference[i]) continue;
      const std::string theirs = i < lines.size() ? lines[i]
                                                  : "nothing (it has only " + std::to_string(lines.size()) + ")";
      const std::string ours = i < reference.size() ? reference[i]
                                                    : "nothing (it has only " + std::to_string(reference.size()) + ")";
      TINYDDP_FAIL("DistributedDataParallel: the model on rank ", r, " differs from rank 0's: parameter #", i, " is ",
                   theirs, " on rank ", r, " but ", ours, " on rank 0",
                   hint("build the same model (same layers, "
                        "sizes and order) on every rank before wrapping it"));
    }
  }
}

void DistributedDataParallel::broadcast_parameters() {
  // All queued at once and awaited together: the backend runs them back to back.
  std::vector<comm::WorkPtr> works;
  for (const NamedParameter& named : module_->named_parameters())
    works.push_back(group_->broadcast(named.parameter->value, 0));
  for (const comm::WorkPtr& work : works) work->wait();
}

Tensor DistributedDataParallel::forward(const Tensor& input) {
  trace::Span span("forward", "ddp");
  for (const auto& [id, hook] : forward_pre_hooks_) hook();
  // PyTorch decides at forward time too: a forward inside no_sync() leads to a local-only backward,
  // even when an earlier forward (say, an evaluation without backward) had armed the reducer.
  if (require_sync_)
    reducer_->prepare_for_backward();
  else if (reducer_->armed())
    reducer_->abandon_iteration();
  return module_->forward(input);
}

Tensor DistributedDataParallel::backward(const Tensor& grad_output, bool want_input_grad) {
  Tensor grad_input;
  try {
    trace::Span span("backward", "ddp");
    grad_input = module_->backward(grad_output, want_input_grad);
  } catch (...) {
    reducer_->abandon_iteration();
    throw;
  }
  trace::Span span("wait for gradients", "ddp");
  reducer_->finalize();
  return grad_input;
}

void DistributedDataParallel::register_comm_hook(std::shared_ptr<comm::ProcessGroup> state, CommHook hook) {
  reducer_->register_comm_hook(std::move(state), std::move(hook));
}

int DistributedDataParallel::add_forward_pre_hook(std::function<void()> hook) {
  TINYDDP_CHECK(hook != nullptr, "DistributedDataParallel::add_forward_pre_hook: the hook is empty",
                hint("pass a "
                     "function to run before every forward"));
  forward_pre_hooks_.emplace_back(next_hook_id_, std::move(hook));
  return next_hook_id_++;
}

void DistributedDataParallel::remove_forward_pre_hook(int id) {
  std::erase_if(forward_pre_hooks_, [id](const auto& entry) { return entry.first == id; });
}

std::string DistributedDataParallel::describe() const {
  std::string inner = module_->describe(), indented;
  for (char c : inner) {
    indented += c;
    if (c == '\n') indented += "  ";
  }
  return "DistributedDataParallel(\n  (module): " + indented + "\n)";
}

std::vector<NamedParameter> DistributedDataParallel::named_parameters() { return module_->named_parameters(); }

void DistributedDataParallel::to(Device device) {
  TINYDDP_FAIL("DistributedDataParallel::to(", device.str(),
               "): a wrapped model cannot move, its gradients are "
               "views into the reducer's buckets",
               hint("call model.to(device) before wrapping it in "
                    "DistributedDataParallel"));
}

DistributedDataParallel::NoSyncGuard::NoSyncGuard(DistributedDataParallel& ddp)
    : ddp_(&ddp), previous_(ddp.require_sync_) {
  ddp.require_sync_ = false;
}

DistributedDataParallel::NoSyncGuard::~NoSyncGuard() {
  if (ddp_) ddp_->require_sync_ = previous_;
}

DistributedDataParallel::NoSyncGuard::NoSyncGuard(NoSyncGuard&& other) noexcept
    : ddp_(std::exchange(other.ddp_, nullptr)), previous_(other.previous_) {}

}  // namespace tinyddp::nn
