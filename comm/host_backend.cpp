#include "tinyddp/comm/host_backend.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <thread>

#include "tinyddp/comm/algorithms/algorithm_selection.h"
#include "tinyddp/comm/algorithms/cross_memory_all_reduce.h"
#include "tinyddp/comm/algorithms/hierarchical_all_gather.h"
#include "tinyddp/comm/algorithms/host_ordered_broadcast.h"
#include "tinyddp/comm/algorithms/link_probe.h"
#include "tinyddp/comm/algorithms/single_rounding.h"
#include "tinyddp/comm/algorithms/slot_all_reduce.h"
#include "tinyddp/comm/algorithms/small_message_allreduce.h"
#include "tinyddp/comm/algorithms/staged_all_reduce.h"
#include "tinyddp/comm/algorithms/symmetric_all_reduce.h"
#include "tinyddp/comm/algorithms/symmetric_hierarchical_all_reduce.h"
#include "tinyddp/comm/algorithms/symmetric_scatter_gather.h"
#include "tinyddp/comm/cpu_binding.h"
#include "tinyddp/comm/store/prefix_store.h"
#include "tinyddp/comm/store/tcp_store.h"
#include "tinyddp/comm/store/torch_tcp_store.h"
#include "tinyddp/comm/symmetric/symmetric_memory.h"
#include "tinyddp/comm/timeout.h"
#include "tinyddp/comm/transport/shm_transport.h"
#include "tinyddp/comm/transport/tcp_transport.h"
#include "tinyddp/comm/tuning.h"
#include "tinyddp/core/env.h"
#include "tinyddp/core/log.h"

namespace tinyddp::comm {

namespace {

// A DETAIL mismatch: every rank raises it together and the streams stay in step, so unlike a
// transport failure it does not abort the group.
class MismatchError : public Error {
 public:
  using Error::Error;
};

// The host memory a collective works on: the tensor itself when it is on the CPU (not even a copy
// of the Tensor handle, which allocates its shape); else a host copy, made in `staging`.
const Tensor& host_input(const Tensor& t, Tensor& staging) {
  if (t.device().is_cpu()) return t;
  staging = Tensor::empty_pinned(t.shape(), t.dtype());  // pinned: the copy can run at full speed
  staging.copy_from(t);
  return staging;
}

// The same for a result: a CUDA tensor gets a host buffer in `staging`, written back afterwards.
const Tensor& host_output(const Tensor& t, Tensor& staging) {
  if (t.device().is_cpu()) return t;
  staging = Tensor::empty_pinned(t.shape(), t.dtype());
  return staging;
}

// Copies a staged host result back into a CUDA tensor (a no-op for CPU tensors).
void write_back(const Tensor& original, const Tensor& host) {
  if (original.device().is_cpu()) return;
  Tensor target = original;
  target.copy_from(host);
}

std::byte* bytes_of(const Tensor& t) { return static_cast<std::byte*>(const_cast<void*>(t.raw_data())); }

// Runs `collective(in, out)` on host memory: CPU tensors as they are, CUDA ones through pinned host
// copies (the input's copied in before, the output's copied back after).
template <class Collective>
void through_host(const Tensor& output, const Tensor& input, const Collective& collective) {
  Tensor in_staging, out_staging;
  const Tensor& in = host_input(input, in_staging);
  const Tensor& out = host_output(output, out_staging);
  collective(in, out);
  write_back(output, out);
}

// The host the store runs on, behind any prefixes: ours (TcpStore), or torchrun's agent store
// (TorchTcpStore); "" for a store in this process.
std::string store_host(Store& store) {
  Store* inner = &store;
  while (auto* prefixed = dynamic_cast<PrefixStore*>(inner)) inner = &prefixed->underlying();
  if (const auto* tcp_store = dynamic_cast<const TcpStore*>(inner)) return tcp_store->host();
  if (const auto* torch_store = dynamic_cast<const TorchTcpStore*>(inner)) return torch_store->host();
  return "";
}

// Keeps `t`'s memory from any other use until the process ends. A rank that leaves a collective
// through the kernel with an error may leave a peer still in it, about to write its reduced slice
// into `t` (cross_memory_all_reduce.h); were the memory freed, the CPU block cache would hand it to
// the next tensor of that size, and the peer's late write would land there. A failure aborts the
// group, so this keeps at most one tensor per group that failed.
void keep_from_reuse(const Tensor& t) {
  static std::mutex mutex;
  static auto* kept = new std::vector<Tensor>();  // never freed: a peer may write until the process exits
  std::lock_guard lock(mutex);
  kept->push_back(t);
}

}  // namespace

// ---- the collectives: check, describe, and say what to do once it runs -------------------------

WorkPtr HostBackend::all_reduce(const Tensor& tensor, ReduceOp op, const CallOptions& call) {
  check_tensor(tensor, "all_reduce", "tensor");
  auto part = symmetric_part(tensor);  // looked up once, for the executor and for the body
  const bool in_symmetric_memory = part.has_value();
  return submit(
      make_fingerprint(CollectiveKind::all_reduce, tensor, tensor.numel(), op), call, in_symmetric_memory,
      [this, part = std::move(part)](const CollectiveContext& ctx, const Tensor& tensor) {
        all_reduce_in_place(tensor, part, ctx);
      },
      tensor);
}

WorkPtr HostBackend::all_reduce_into(const Tensor& output, const Tensor& input, ReduceOp op, const CallOptions& call) {
  check_tensor(output, "all_reduce_into", "output");
  check_tensor(input, "all_reduce_into", "input");
  check_same(output, input, "all_reduce_into");
  // An output in symmetric memory (looked up once) takes a CPU input: copied there, and reduced in place.
  auto part = input.device().is_cpu() ? symmetric_part(output) : std::nullopt;
  const bool in_symmetric_memory = part.has_value();
  return submit(
      make_fingerprint(CollectiveKind::all_reduce, input, input.numel(), op), call, in_symmetric_memory,
      [this, part = std::move(part)](const CollectiveContext& ctx, const Tensor& output, const Tensor& input) {
        if (part) {
          if (bytes_of(output) != bytes_of(input)) std::memmove(bytes_of(output), bytes_of(input), input.nbytes());
          if (symmetric_all_reduce_bytes(part, size_t(output.numel()), ctx)) return;
          all_reduce_bytes(bytes_of(output), bytes_of(output), size_t(output.numel()), ctx);
          return;
        }
        through_host(output, input, [&](const Tensor& in, const Tensor& out) {
          all_reduce_bytes(bytes_of(in), bytes_of(out), size_t(in.numel()), ctx);
        });
      },
      output, input);
}

WorkPtr HostBackend::all_reduce_coalesced(const std::vector<Tensor>& tensors, ReduceOp op, const CallOptions& call) {
  TINYDDP_CHECK(!tensors.empty(), "all_reduce_coalesced: no tensors were given", hint("pass at least one tensor"));
  int64_t total = 0;
  for (const Tensor& t : tensors) {
    check_tensor(t, "all_reduce_coalesced", "tensor");
    TINYDDP_CHECK(t.dtype() == tensors[0].dtype(), "all_reduce_coalesced: tensors mix ", dtype_name(tensors[0].dtype()),
                  " and ", dtype_name(t.dtype()), hint("coalesce tensors of one dtype per call"));
    total += t.numel();
  }
  return submit(
      make_fingerprint(CollectiveKind::all_reduce, tensors[0], total, op), call, false,
      [this](const CollectiveContext& ctx, const std::vector<Tensor>& tensors) {
        for (const Tensor& t : tensors) all_reduce_in_place(t, symmetric_part(t), ctx);
      },
      tensors);
}

WorkPtr HostBackend::broadcast(const Tensor& tensor, int root, const CallOptions& call) {
  check_tensor(tensor, "broadcast", "tensor");
  check_root(root, "broadcast");
  return submit(
      make_fingerprint(CollectiveKind::broadcast, tensor, tensor.numel(), std::nullopt, root), call, false,
      [this, root](const CollectiveContext& ctx, const Tensor& tensor) {
        if (size() == 1 || tensor.numel() == 0) return;
        Tensor staging;
        const Tensor& host = host_input(tensor, staging);
        host_ordered_broadcast(
            all_reduce_->layout(), [this](int r) { return peer(r); }, rank(), bytes_of(host), host.nbytes(), root, ctx);
        if (rank() != root) write_back(tensor, host);
      },
      tensor);
}

WorkPtr HostBackend::all_gather(const Tensor& output, const Tensor& input, const CallOptions& call) {
  check_tensor(output, "all_gather", "output");
  check_tensor(input, "all_gather", "input");
  TINYDDP_CHECK(output.dtype() == input.dtype() && output.numel() == input.numel() * size(), "all_gather: output ",
                output.describe(), " must hold world size (", size(), ") x input ", input.describe(),
                hint("allocate the output with ", input.numel() * size(), " elements of ", dtype_name(input.dtype())));
  return submit(
      make_fingerprint(CollectiveKind::all_gather, input, input.numel(), std::nullopt), call, false,
      [this](const CollectiveContext& ctx, const Tensor& output, const Tensor& input) {
        if (symmetric_all_gather_bytes(output, input, ctx)) return;
        through_host(output, input, [&](const Tensor& in, const Tensor& out) {
          if (size() == 1) {
            if (in.numel() > 0 && bytes_of(out) != bytes_of(in)) std::memmove(bytes_of(out), bytes_of(in), in.nbytes());
          } else if (hierarchical_all_gather_applies(all_reduce_->layout()) &&
                     all_reduce_->forced() != AllReduceAlgorithm::ring) {
            hierarchical_all_gather(
                all_reduce_->layout(), [this](int r) { return peer(r); }, rank(), bytes_of(in), bytes_of(out),
                size_t(in.numel()), ctx);
          } else {
            ring_all_gather(ring(), bytes_of(in), bytes_of(out), size_t(in.numel()), ctx);
          }
        });
      },
      output, input);
}

WorkPtr HostBackend::reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op, const CallOptions& call) {
  check_tensor(output, "reduce_scatter", "output");
  check_tensor(input, "reduce_scatter", "input");
  TINYDDP_CHECK(output.dtype() == input.dtype() && input.numel() == output.numel() * size(), "reduce_scatter: input ",
                input.describe(), " must hold world size (", size(), ") x output ", output.describe(),
                hint("the input is the concatenation of one output-sized part per rank"));
  return submit(
      make_fingerprint(CollectiveKind::reduce_scatter, output, output.numel(), op), call, false,
      [this](const CollectiveContext& ctx, const Tensor& output, const Tensor& input) {
        if (symmetric_reduce_scatter_bytes(output, input, ctx)) return;
        through_host(output, input, [&](const Tensor& in, const Tensor& out) {
          if (size() == 1) {
            if (in.numel() > 0) std::memmove(bytes_of(out), bytes_of(in), in.nbytes());
          } else {
            ring_reduce_scatter(ring(), bytes_of(in), bytes_of(out), size_t(out.numel()), ctx);
          }
        });
      },
      output, input);
}

namespace {
// `plain`: the collective to call instead for other dtypes and ops.
void check_single_rounding(const Tensor& t, ReduceOp op, const char* collective, const char* plain) {
  TINYDDP_CHECK(single_rounding_supports(t.dtype(), op), collective, ": takes bf16 or f16 with sum or avg, got ",
                t.describe(), " with ", reduce_op_name(op),
                hint("convert the tensor to bf16 (kernels::convert), ", "or call ", plain,
                     " for other dtypes and ops"));
}
}  // namespace

WorkPtr HostBackend::all_reduce_single_rounding(const Tensor& tensor, ReduceOp op, const CallOptions& call) {
  constexpr const char* name = "all_reduce_single_rounding";
  check_tensor(tensor, name, "tensor");
  check_single_rounding(tensor, op, name, "all_reduce");
  return submit(
      make_fingerprint(CollectiveKind::all_reduce_single_rounding, tensor, tensor.numel(), op), call, false,
      [this](const CollectiveContext& ctx, const Tensor& tensor) {
        Tensor staging;
        const Tensor& host = host_input(tensor, staging);
        single_rounding_all_reduce(all_peers(), ring(), bytes_of(host), bytes_of(host), size_t(host.numel()), ctx);
        write_back(tensor, host);
      },
      tensor);
}

WorkPtr HostBackend::reduce_scatter_single_rounding(const Tensor& output, const Tensor& input, ReduceOp op,
                                                    const CallOptions& call) {
  constexpr const char* name = "reduce_scatter_single_rounding";
  check_tensor(output, name, "output");
  check_tensor(input, name, "input");
  check_single_rounding(input, op, name, "reduce_scatter");
  TINYDDP_CHECK(output.dtype() == input.dtype() && input.numel() == output.numel() * size(), name, ": input ",
                input.describe(), " must hold world size (", size(), ") x output ", output.describe(),
                hint("the input is the concatenation of one output-sized part per rank"));
  return submit(
      make_fingerprint(CollectiveKind::reduce_scatter_single_rounding, output, output.numel(), op), call, false,
      [this](const CollectiveContext& ctx, const Tensor& output, const Tensor& input) {
        through_host(output, input, [&](const Tensor& in, const Tensor& out) {
          single_rounding_reduce_scatter(all_peers(), rank(), bytes_of(in), bytes_of(out), size_t(in.numel()), ctx);
        });
      },
      output, input);
}

WorkPtr HostBackend::barrier(const CallOptions& call) {
  return submit(make_fingerprint(CollectiveKind::barrier, Tensor(), 0, std::nullopt), call, false,
                [this](const CollectiveContext& ctx) {
                  if (size() == 1) return;
                  // A one-element all-reduce: nobody gets past it before everyone has sent.
                  int32_t token = 1, total = 0;
                  CollectiveContext as_sum = ctx;
                  as_sum.dtype = DType::i32;
                  as_sum.op = ReduceOp::sum;
                  if (!slot_all_reduce_bytes(reinterpret_cast<const std::byte*>(&token),
                                             reinterpret_cast<std::byte*>(&total), 1, as_sum))
                    direct_all_reduce(all_peers(), rank(), reinterpret_cast<const std::byte*>(&token),
                                      reinterpret_cast<std::byte*>(&total), 1, as_sum);
                });
}

// ---- the task: numbered, queued, run with its context ----------------------------------------------

WorkPtr HostBackend::submit_task(Fingerprint fingerprint, const CallOptions& call, bool in_symmetric_memory,
                                 Executor::BodyRef body, FunctionRef<Executor::Body()> owned_body) {
  const auto timeout = call.timeout.count() > 0 ? call.timeout : options_.timeout;
  // Per rank; a barrier's is 0.
  const size_t bytes = size_t(fingerprint.count) * dtype_size(DType(fingerprint.dtype));
  const bool symmetric_path = in_symmetric_memory && all_local_;
  const bool small = bytes <= (symmetric_path ? tuning::kBlockingCallerSymmetricBytes : blocking_caller_bytes_);
  const auto now = std::chrono::steady_clock::now();  // one reading for the recorder and the executor
  WorkPtr work;
  // Numbered and recorded as the executor takes it, before any runner can start it; one that runs
  // here now is recorded started at once.
  auto run_here =
      executor_->submit(Executor::Task{nullptr, std::move(fingerprint), timeout, {}, small, call.blocking, now},
                        [&](Executor::Task& task, bool runs_here) {
                          task.fingerprint.sequence = next_sequence_++;
                          task.work = work = std::make_shared<Work>(task.fingerprint);
                          if (runs_here) {
                            recorder_->queued_and_started(task.fingerprint, call.bucket, now);
                          } else {
                            recorder_->queued(task.fingerprint, call.bucket, now);
                            task.body = owned_body();
                          }
                        });
  // A blocking call with nothing queued before it runs here and now, outside the executor's lock:
  // another thread's call queues behind it meanwhile. One with collectives before it waits for them,
  // then runs.
  if (run_here) {
    executor_->run_claimed(std::move(*run_here), body);
    if (auto error = work->exception()) std::rethrow_exception(error);
  } else if (call.blocking) {
    work->wait();
  }
  return work;
}

// Runs on whichever thread the Executor picked; a failure is thrown to it, which fails the Work.
void HostBackend::run_task(const Executor::Task& task, Executor::BodyRef body) {
  // A claimed task started as it was queued, and the recorder has it so (submit).
  const bool claimed = task.started_at != std::chrono::steady_clock::time_point{};
  const auto start = claimed ? task.started_at : std::chrono::steady_clock::now();
  const auto deadline = start + task.timeout;
  if (!claimed) recorder_->started(task.fingerprint.sequence, start);
  try {
    TINYDDP_CHECK(aborted_.empty(), "rank ", rank(), ": ", task.work->description(),
                  " cannot run: this process group was aborted by an earlier failure: ", aborted_,
                  hint("handle that failure, then create a new process group on every rank"));
    CollectiveContext ctx;
    ctx.rank = rank();
    ctx.work = task.work.get();
    ctx.sequence = task.fingerprint.sequence;
    ctx.dtype = DType(task.fingerprint.dtype);
    ctx.op = ReduceOp(task.fingerprint.op);
    ctx.world_size = size();
    ctx.timeout = task.timeout;
    ctx.deadline = deadline;
    ctx.wait = wait_;
    // A caller running its own collective leaves no thread of its rank waiting for the core, so it
    // yields only to a peer that may share it.
    if (Executor::running_as_unbound_caller()) ctx.wait.yield_while_spinning = shares_cpus_with_peers_;
    ctx.transports = transports_;
    if (debug_detail_ && size() > 1) check_fingerprints(task.fingerprint, ctx);
    body(ctx);
    recorder_->finished(task.fingerprint.sequence, true);
  } catch (const MismatchError&) {
    recorder_->finished(task.fingerprint.sequence, false);
    throw;
  } catch (const std::exception& e) {
    recorder_->finished(task.fingerprint.sequence, false);
    const auto* error = dynamic_cast<const Error*>(&e);
    std::string problem = error ? error->problem() : e.what();
    std::string advice = error ? error->hint() : "";
    const bool timed_out = std::chrono::steady_clock::now() >= deadline;
    if (timed_out) explain_timeout(task, problem, advice);
    const std::string message = advice.empty() ? problem : problem + "; hint: " + advice;
    // A timeout or a peer failure leaves the byte streams out of step: abort the group and tell
    // the peers, so that they fail now and name this failure instead of timing out.
    if (aborted_.empty()) {
      aborted_ = message;
      // The peers' parts of symmetric buffers go now: a dead peer's memory is freed once nobody maps it.
      if (symmetric_) symmetric_->release_peers();
      if (cross_memory_) cross_memory_->release_peers();
      if (slots_) slots_->release_peers();
      if (staging_) staging_->release_peers();
      // The problem alone: the peers add their own hint.
      for (Transport* t : transports_) t->abort("rank " + std::to_string(rank()) + " failed: " + problem);
    }
    recorder_->set_error(message);
    std::string record = recorder_->dump(timed_out ? "timeout" : "error");
    if (!record.empty()) problem += " (flight record: " + record + ")";
    if (timed_out || !record.empty()) throw Error(problem, Hint{advice}, "", __FILE__, __LINE__);
    throw;
  }
}

// A collective that timed out names the neighbour it waited on; the board names the rank the whole
// group waits for (collective_watchdog.h).
void HostBackend::explain_timeout(const Executor::Task& task, std::string& problem, std::string& advice) {
  std::string what = recorder_->describe(task.fingerprint.sequence);
  if (what.empty()) what = task.work->description();
  const std::string verdict = watchdog_->explain_stall(task.fingerprint.sequence, what,
                                                       CollectiveWatchdog::kVerdictPatience);
  if (verdict.empty()) {
    (advice.empty() ? problem : advice) += "; " + timeout_hint(task.timeout);
    return;
  }
  problem += "; stalled: " + verdict;
  advice =
      "find out why that rank stalls (TINYDDP_FLIGHT_RECORDER=DIR keeps every rank's last collectives; "
      "tinyddp-run --explain DIR reads them); " +
      timeout_hint(task.timeout);
}

void HostBackend::check_fingerprints(const Fingerprint& mine, const CollectiveContext& ctx) {
  std::vector<Fingerprint> all(static_cast<size_t>(size()));
  CollectiveContext check = ctx;
  check.phase = " (TINYDDP_DEBUG=DETAIL fingerprint exchange)";
  direct_all_gather(all_peers(), rank(), reinterpret_cast<const std::byte*>(&mine),
                    reinterpret_cast<std::byte*>(all.data()), sizeof(Fingerprint), check);
  std::string mismatch = fingerprint_mismatch(all);
  if (!mismatch.empty()) throw MismatchError(mismatch, "", __FILE__, __LINE__);
}

// ---- the algorithm ----------------------------------------------------------------------------------

void HostBackend::all_reduce_in_place(const Tensor& tensor, const std::optional<SymmetricMemory::Found>& part,
                                      const CollectiveContext& ctx) {
  if (symmetric_all_reduce_bytes(part, size_t(tensor.numel()), ctx)) return;
  if (cross_memory_all_reduce_bytes(tensor, ctx)) return;
  Tensor staging;
  const Tensor& host = host_input(tensor, staging);
  all_reduce_bytes(bytes_of(host), bytes_of(host), size_t(host.numel()), ctx);
  write_back(tensor, host);
}

bool HostBackend::symmetric_all_reduce_bytes(const std::optional<SymmetricMemory::Found>& part, size_t count,
                                             const CollectiveContext& ctx) {
  // A group that failed since the call was made has let go of its peers' parts.
  if (!part || !part->buffer->peers_mapped()) return false;
  const size_t bytes = count * dtype_size(ctx.dtype);
  // Across hosts only where the FIFO path would take the hierarchical algorithm, whose in-host phases
  // this replaces (every rank chooses alike, so every host takes its part of the same algorithm).
  // A layout with unequal hosts is left to the FIFO version, which refuses it with its reason.
  if (!all_local_ && (bytes == 0 || all_reduce_->choose(bytes) != AllReduceAlgorithm::hierarchical ||
                      !all_reduce_->layout().is_uniform()))
    return false;
  std::byte* data = part->buffer->data() + part->offset;
  if (!all_local_) {
    const HostLayout& layout = all_reduce_->layout();
    symmetric_hierarchical_all_reduce(*part->buffer, part->offset, count, *shm_,
                                      cross_host_group(
                                          layout, [this](int r) { return peer(r); }, rank()),
                                      flat_algorithm(all_reduce_->choose_across_hosts(bytes)), ctx);
  } else if (!slot_all_reduce_bytes(data, data, count, ctx)) {
    // The slots where the FIFO path would take the direct exchange, two-shot where it would take the
    // ring: the same fold order, so the same bits.
    symmetric_all_reduce(*part->buffer, part->offset, count, *shm_, ctx);
  }
  symmetric_collectives_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

// Every rank of a group on one host takes these paths together: the symmetric tensors are the same
// allocation on each, and the call check at the first barrier names a rank that passed another.
std::optional<SymmetricMemory::Found> HostBackend::symmetric_window(const Tensor& t) const {
  if (!all_local_ || t.numel() == 0) return std::nullopt;
  return symmetric_part(t);
}

bool HostBackend::symmetric_reduce_scatter_bytes(const Tensor& output, const Tensor& input,
                                                 const CollectiveContext& ctx) {
  auto found = symmetric_window(input);
  if (!found || !output.device().is_cpu()) return false;
  symmetric_reduce_scatter(*found->buffer, found->offset, size_t(output.numel()), bytes_of(output), *shm_, ctx);
  symmetric_collectives_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

bool HostBackend::symmetric_all_gather_bytes(const Tensor& output, const Tensor& input, const CollectiveContext& ctx) {
  auto found = symmetric_window(output);
  if (!found || !input.device().is_cpu()) return false;
  symmetric_all_gather(*found->buffer, found->offset, size_t(input.numel()), bytes_of(input), *shm_, ctx);
  symmetric_collectives_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

bool HostBackend::slot_all_reduce_bytes(const std::byte* in, std::byte* out, size_t count,
                                        const CollectiveContext& ctx) {
  const size_t bytes = count * dtype_size(ctx.dtype);
  if (!slots_ || bytes > slot_capacity(*slots_) || all_reduce_->choose(bytes) != AllReduceAlgorithm::direct)
    return false;
  slot_all_reduce(*slots_, in, out, count, *shm_, ctx);
  slot_collectives_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

bool HostBackend::staged_all_reduce_bytes(const std::byte* in, std::byte* out, size_t count,
                                          const CollectiveContext& ctx) {
  const size_t bytes = count * dtype_size(ctx.dtype);
  if (!staging_ || bytes < tuning::kStagedAllReduceBytes || all_reduce_->choose(bytes) != AllReduceAlgorithm::ring)
    return false;
  staged_all_reduce(*staging_, in, out, count, *shm_, ctx);
  staged_collectives_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

bool HostBackend::cross_memory_all_reduce_bytes(const Tensor& t, const CollectiveContext& ctx) {
  // Only in the ring's place: an algorithm the user asked for (TINYDDP_ALGO) runs as asked.
  if (!cross_memory_ || !t.device().is_cpu() || t.nbytes() < cross_memory_from_bytes_ ||
      all_reduce_->choose(t.nbytes()) != AllReduceAlgorithm::ring)
    return false;
  try {
    cross_memory_all_reduce(*cross_memory_, local_pids_, bytes_of(t), size_t(t.numel()), *shm_, ctx);
  } catch (...) {
    keep_from_reuse(t);
    throw;
  }
  cross_memory_collectives_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

Tensor HostBackend::allocate_symmetric(const Shape& shape, DType dtype) {
  if (!symmetric_) return ProcessGroup::allocate_symmetric(shape, dtype);
  return symmetric_->allocate(shape, dtype);
}

bool HostBackend::is_symmetric(const Tensor& t) const { return symmetric_part(t).has_value(); }

std::optional<SymmetricMemory::Found> HostBackend::symmetric_part(const Tensor& t) const {
  if (!symmetric_ || symmetric_->empty() || !t.defined() || !t.device().is_cpu()) return std::nullopt;
  return symmetric_->find(t.raw_data(), t.nbytes());
}

void HostBackend::all_reduce_bytes(const std::byte* in, std::byte* out, size_t count, const CollectiveContext& ctx) {
  if (slot_all_reduce_bytes(in, out, count, ctx) || staged_all_reduce_bytes(in, out, count, ctx)) return;
  run_all_reduce(
      *all_reduce_, [this](int r) { return peer(r); }, rank(), in, out, count, ctx);
}

Ring HostBackend::ring() {
  return Ring{rank(), size(), peer((rank() + 1) % size()), peer((rank() + size() - 1) % size())};
}

// Only the thread that runs the collectives calls these (one collective at a time).
Connection* HostBackend::peer(int r) {
  Connection*& connection = peers_[size_t(r)];
  if (!connection && r != rank()) connection = routes_[size_t(r)]->connection(r);
  return connection;
}

std::span<Connection* const> HostBackend::all_peers() {
  for (int r = 0; r < size(); ++r) peer(r);
  return peers_;
}

// ---- setup ------------------------------------------------------------------------------------------

// Where every rank runs: its host identity and pid, and which ranks share this rank's host.
struct HostBackend::Hosts {
  std::vector<std::string> ids;   // by rank
  std::vector<int> pids;          // by rank
  std::vector<std::string> cpus;  // by rank: the CPUs it may run on (cpu_binding.h's lists; "" unknown)
  std::vector<int> local;         // the ranks on this host, this one included, in rank order
  std::vector<int> remote;        // the others
};

HostBackend::HostBackend(std::shared_ptr<Store> store, int rank, int size, const ProcessGroupOptions& options)
    : ProcessGroup(rank, size),
      store_(std::move(store)),
      options_(options),
      debug_detail_(options.debug_detail.value_or(debug_detail_from_environment())),
      small_message_bytes_(options.small_message_bytes.value_or(
          env::unsigned_integer("TINYDDP_SMALL_MESSAGE_BYTES").value_or(tuning::kSmallMessageBytes))),
      peers_(size_t(size), nullptr),
      routes_(size_t(size), nullptr) {
  TINYDDP_CHECK(store_ != nullptr, "host backend: no store was given",
                hint("pass the TcpStore (or HashStore) the ranks share"));
  TINYDDP_CHECK(size >= 1 && rank >= 0 && rank < size, "host backend: rank ", rank, " of world size ", size,
                " is impossible", hint("ranks go from 0 to world size - 1"));
  const std::string& mode = options.transport;
  TINYDDP_CHECK(mode == "auto" || mode == "tcp" || mode == "shm", "host backend: unknown transport '", mode, "'",
                hint("use tcp, shm or auto"));

  // Every rank's n-th group of this name meets the others' n-th one, even on a reused store.
  const std::string base = "tinyddp/pg/" + options.group_name + "/";
  const int64_t generation = store_->add(base + "generation/" + std::to_string(rank), 1);
  const std::string prefix = base + std::to_string(generation) + "/";

  const Hosts hosts = meet_hosts(prefix);
  open_transports(prefix, hosts);
  open_cross_memory(prefix, hosts);
  choose_waiting(hosts);
  HostLayout layout = HostLayout::from_host_ids(hosts.ids);
  const AllReduceAlgorithm algorithm = algorithm_from_options(options.algorithm);
  // A forced algorithm needs no model, and so no probe.
  CostModel model = algorithm == AllReduceAlgorithm::automatic ? agree_on_cost_model(prefix, layout) : CostModel{};
  all_reduce_ = std::make_unique<AllReduceSelector>(algorithm, model, std::move(layout), small_message_bytes_);
  recorder_ = std::make_unique<FlightRecorder>(rank, size, options.group_name,
                                               FlightRecorder::capacity_from_environment());
  if (!FlightRecorder::directory().empty()) FlightRecorder::install_dump_signal();
  std::vector<std::string> host_names;
  for (const std::string& id : hosts.ids) host_names.push_back(id.substr(0, id.find('/')));
  watchdog_ = std::make_unique<CollectiveWatchdog>(store_, prefix, *recorder_, host_names, hosts.pids,
                                                   options_.timeout);
  executor_ = std::make_shared<Executor>([this](const Executor::Task& task,
                                                Executor::BodyRef body) { run_task(task, body); },
                                         cpu_, wait_);
}

// The cost model only chooses across hosts (algorithm_selection.h); there every rank takes rank 0's:
// the built-in one, a tuning file's, or measured (TINYDDP_COST_MODEL=probe, link_probe.h).
CostModel HostBackend::agree_on_cost_model(const std::string& prefix, const HostLayout& layout) {
  if (layout.hosts() <= 1) return CostModel{};
  if (!CostModel::probe_requested())
    return agree_on_model(*store_, prefix + "cost_model", rank(), CostModel::from_environment(), options_.timeout);
  CollectiveContext ctx;
  ctx.rank = rank();
  ctx.phase = " (measuring the links for the cost model, TINYDDP_COST_MODEL=probe)";
  ctx.world_size = size();
  ctx.timeout = options_.timeout;
  ctx.deadline = std::chrono::steady_clock::now() + options_.timeout;
  ctx.wait = wait_;
  ctx.transports = transports_;
  const auto start = std::chrono::steady_clock::now();
  CostModel model = probe_cost_model(
      *store_, prefix + "cost_model/", layout, [this](int r) { return peer(r); }, rank(), ctx, CostModel{});
  if (rank() == 0 && debug_level() != DebugLevel::off) {
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    std::string text = model.to_text();
    std::replace(text.begin(), text.end(), '\n', ' ');
    log_line(LogLevel::info, "host", "cost model measured in " + std::to_string(ms) + " ms: " + text);
  }
  return model;
}

HostBackend::~HostBackend() {
  executor_->shutdown();  // queued collectives still run: the peers expect them
  // Tensors in symmetric memory may outlive the group: they keep this rank's part, not the peers'.
  if (symmetric_) symmetric_->release_peers();
}

std::string HostBackend::transport_to(int peer) const {
  if (peer == rank()) return "self";
  return routes_.at(size_t(peer))->name();
}

// Every rank publishes "pid cpus host-identity" (cpus "-" when unknown) and reads everyone's.
HostBackend::Hosts HostBackend::meet_hosts(const std::string& prefix) {
  const std::string cpus = own_cpu_list();
  store_->set(prefix + "host/" + std::to_string(rank()),
              std::to_string(::getpid()) + " " + (cpus.empty() ? "-" : cpus) + " " + host_identity());
  std::vector<std::string> keys;
  for (int r = 0; r < size(); ++r) keys.push_back(prefix + "host/" + std::to_string(r));
  store_->wait(keys, options_.timeout);
  Hosts hosts;
  hosts.ids = store_->multi_get(keys);
  hosts.pids.resize(size_t(size()));
  hosts.cpus.resize(size_t(size()));
  for (int r = 0; r < size(); ++r) {
    const auto first = hosts.ids[r].find(' '), second = hosts.ids[r].find(' ', first + 1);
    hosts.pids[r] = std::stoi(hosts.ids[r].substr(0, first));
    hosts.cpus[r] = hosts.ids[r].substr(first + 1, second - first - 1);
    if (hosts.cpus[r] == "-") hosts.cpus[r].clear();
    hosts.ids[r] = hosts.ids[r].substr(second + 1);
  }
  for (int r = 0; r < size(); ++r) (hosts.ids[r] == hosts.ids[rank()] ? hosts.local : hosts.remote).push_back(r);
  return hosts;
}

// Shared memory between the ranks of this host, tcp to the others (or tcp / shm everywhere, as
// options.transport says); fills routes_ and transports_.
void HostBackend::open_transports(const std::string& prefix, const Hosts& hosts) {
  const std::string& mode = options_.transport;
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  std::vector<int> tcp_peers;
  if (mode == "tcp") {
    for (int r = 0; r < size(); ++r)
      if (r != rank()) tcp_peers.push_back(r);
  } else {
    if (mode == "shm") {
      std::string others;
      for (int r : hosts.remote) others += (others.empty() ? "" : ", ") + std::to_string(r);
      TINYDDP_CHECK(hosts.remote.empty(), "host backend: transport 'shm' needs every rank on one host, but rank(s) ",
                    others, " run on another host than rank ", rank(),
                    hint("use transport 'auto' (shm within a host, tcp across) or 'tcp'"));
    }
    tcp_peers = hosts.remote;
    if (hosts.local.size() > 1) {
      ShmTransportOptions shm_options;
      shm_options.fifo_bytes = options_.shm_fifo_bytes;
      // Long turns while every rank of the host has a core of its own (tuning.h).
      if (hosts.local.size() <= cores) shm_options.bytes_per_turn = tuning::kBytesPerTurnShmOwnCores;
      shm_ = std::make_unique<ShmTransport>(*store_, prefix, rank(), hosts.local, options_.timeout, shm_options);
      transports_.push_back(shm_.get());
      // Without it, allocate_symmetric gives ordinary tensors, which take the fifos.
      if (SymmetricBuffer::peers_openable())
        // Keys of their own per host (its lowest rank names it): the count of peers that mapped a part
        // is a count among the host's ranks.
        symmetric_ = std::make_unique<SymmetricMemory>(store_,
                                                       prefix + "host-" + std::to_string(hosts.local.front()) +
                                                           "/symmetric/",
                                                       rank(), hosts.local, options_.timeout);
      else if (rank() == hosts.local.front())
        log_line(LogLevel::info, "host", "no symmetric memory: /proc is not this pid namespace's own");
      all_local_ = hosts.remote.empty();
      // The slots of the small all-reduces; TINYDDP_SLOTS=0 leaves those to the direct exchange (to
      // measure one against the other).
      if (all_local_ && symmetric_ && env::flag("TINYDDP_SLOTS").value_or(true))
        slots_ = SymmetricBuffer::allocate(*store_, prefix + "slots/", 0, rank(), hosts.local,
                                           2 * std::min(small_message_bytes_, tuning::kSlotBytes), options_.timeout);
      // The staging of large all-reduces of ordinary memory; TINYDDP_STAGING=0 leaves those to the fifos
      // (or to process_vm_readv, where TINYDDP_CROSS_MEMORY asks for it).
      if (all_local_ && symmetric_ && env::flag("TINYDDP_STAGING").value_or(tuning::kStagingByDefault))
        staging_ = SymmetricBuffer::allocate(*store_, prefix + "staging/", 0, rank(), hosts.local,
                                             2 * tuning::kStagingHalfBytes, options_.timeout);
    }
  }
  if (!tcp_peers.empty()) {
    TcpTransportOptions tcp_options;
    tcp_options.token = options_.token.value_or(TcpStore::token_from_environment());
    tcp_options.socket_buffer_bytes = options_.tcp_buffer_bytes
                                          ? options_.tcp_buffer_bytes
                                          : env::unsigned_integer("TINYDDP_TCP_BUFFER_BYTES").value_or(0);
    // The store's host: every rank reaches it, so the interface toward it faces the other hosts.
    tcp_options.route_to = store_host(*store_);
    tcp_ = std::make_unique<TcpTransport>(*store_, prefix, rank(), tcp_peers, hosts.ids, hosts.pids, options_.timeout,
                                          tcp_options);
    transports_.push_back(tcp_.get());
  }
  // Connections are fetched on first use (peer()): shared memory maps a peer's fifos only then.
  for (int r = 0; r < size(); ++r) {
    if (r == rank()) continue;
    bool over_tcp = std::find(tcp_peers.begin(), tcp_peers.end(), r) != tcp_peers.end();
    routes_[r] = over_tcp ? static_cast<Transport*>(tcp_.get()) : shm_.get();
  }
  // Two ranks over tcp only: the direct exchange's crossover is higher there (tuning.h).
  if (size() == 2 && tcp_ && !shm_ && !options_.small_message_bytes && !env::text("TINYDDP_SMALL_MESSAGE_BYTES"))
    small_message_bytes_ = tuning::kSmallMessageBytesTcpPair;
}

// Ordinary tensors of a group whose ranks all share this host may be read out of the peers'
// memory with process_vm_readv, if every rank may read every other (ptrace permission): each rank
// tries the others once, here, and the path is used only if all of them succeed, so that every rank
// makes the same choice. TINYDDP_CROSS_MEMORY=0 keeps ordinary tensors on the fifos (or the staging),
// =1 takes the path from the least size it may take, at every size above it (to measure it); unset:
// tuning::kCrossMemoryByDefault, from tuning::kCrossMemoryDefaultBytes.
void HostBackend::open_cross_memory(const std::string& prefix, const Hosts& hosts) {
  if (!shm_ || !all_local_ || !SymmetricBuffer::peers_openable()) return;  // its control buffer is one
  const std::optional<bool> asked = env::flag("TINYDDP_CROSS_MEMORY");
  if (!asked.value_or(tuning::kCrossMemoryByDefault)) return;
  cross_memory_from_bytes_ = asked ? tuning::kCrossMemoryAllReduceBytes : tuning::kCrossMemoryDefaultBytes;
  const std::string base = prefix + "cross-memory/";
  auto control = SymmetricBuffer::allocate(*store_, base, 0, rank(), hosts.local, 64, options_.timeout);
  store_->set(base + "probe/" + std::to_string(rank()), std::to_string(reinterpret_cast<uintptr_t>(control->data())));
  std::vector<std::string> probes, verdicts;
  for (int r : hosts.local) probes.push_back(base + "probe/" + std::to_string(r));
  store_->wait(probes, options_.timeout);
  const std::vector<std::string> addresses = store_->multi_get(probes);
  std::string mine;
  for (size_t i = 0; i < hosts.local.size() && mine.empty(); ++i) {
    const int r = hosts.local[i];
    if (r == rank()) continue;
    const auto* at = reinterpret_cast<const void*>(uintptr_t(std::stoull(addresses[i])));
    std::string why = cross_memory_unreadable(hosts.pids[size_t(r)], at, 64);
    if (!why.empty()) mine = "rank " + std::to_string(rank()) + " cannot read rank " + std::to_string(r) + ": " + why;
  }
  store_->set(base + "verdict/" + std::to_string(rank()), mine.empty() ? "ok" : mine);
  for (int r : hosts.local) verdicts.push_back(base + "verdict/" + std::to_string(r));
  store_->wait(verdicts, options_.timeout);
  for (const std::string& verdict : store_->multi_get(verdicts))
    if (verdict != "ok") {
      if (rank() == hosts.local.front())
        log_line(LogLevel::info, "host", "ordinary tensors go through the shared-memory fifos: " + verdict);
      return;
    }
  for (int r : hosts.local) local_pids_.push_back(hosts.pids[size_t(r)]);
  cross_memory_ = std::move(control);
}

// How this group's threads wait, and where its communication thread runs: both depend on whether
// the ranks of this host outnumber its cores.
void HostBackend::choose_waiting(const Hosts& hosts) {
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  if (hosts.local.size() > cores) {
    wait_.spin = tuning::kSpinBudgetOversubscribed;
    wait_.pure_spin = tuning::kPureSpinOversubscribed;
  }
  if (auto spin_us = env::unsigned_integer("TINYDDP_SPIN_US"))  // for tuning on a new host
    wait_.spin = std::chrono::microseconds(*spin_us);
  blocking_caller_bytes_ = std::min(small_message_bytes_, tuning::kBlockingCallerBytes);
  if (auto bytes = env::unsigned_integer("TINYDDP_BLOCKING_CALLER_BYTES"))  // the same
    blocking_caller_bytes_ = size_t(*bytes);
  const int local_index = int(std::find(hosts.local.begin(), hosts.local.end(), rank()) - hosts.local.begin());
  cpu_ = pick_communication_cpu(local_index, int(hosts.local.size()));
  wait_.yield_while_spinning = cpu_ < 0;
  std::vector<std::string> peer_cpus;
  for (int r : hosts.local)
    if (r != rank()) peer_cpus.push_back(hosts.cpus[size_t(r)]);
  shares_cpus_with_peers_ = may_share_cpus(hosts.cpus[size_t(rank())], peer_cpus);
}

}  // namespace tinyddp::comm
