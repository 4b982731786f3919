#include "tinyddp/nn/ddp/comm_hook.h"

#include <utility>

#include "tinyddp/core/error.h"
#include "tinyddp/kernels/ops.h"

namespace tinyddp::nn {

CommHookFuture::CommHookFuture(comm::WorkPtr work, std::function<void()> then)
    : work_(std::move(work)), then_(std::move(then)) {
  TINYDDP_CHECK(work_ != nullptr, "CommHookFuture: the work is null",
                hint("return the Work of the collective the "
                     "hook started (e.g. group.all_reduce(...)), or comm::Work::completed(...) when it needed none"));
}

void CommHookFuture::wait() {
  TINYDDP_CHECK(work_ != nullptr, "CommHookFuture::wait: this future holds no work",
                hint("a comm hook must return "
                     "CommHookFuture(work), not a default-constructed one"));
  work_->wait();
  if (then_) {
    // Cleared before it runs, so a second wait() (or a throwing `then`) never applies it twice.
    std::function<void()> then = std::move(then_);
    then_ = nullptr;
    then();
  }
}

namespace comm_hooks {

CommHookFuture allreduce(comm::ProcessGroup& group, GradBucket& bucket) {
  return CommHookFuture(group.all_reduce(bucket.buffer, comm::ReduceOp::avg, bucket.call_options()));
}

namespace {

using StartReduction = std::function<comm::WorkPtr(const Tensor& compressed)>;

// What the 16-bit hooks share: the bucket converted into a new `dtype` copy, `reduce` started on
// it, and the copy converted back into the bucket once the reduction finished.
CommHookFuture reduce_compressed(GradBucket& bucket, DType dtype, const StartReduction& reduce) {
  Tensor compressed = Tensor::empty({bucket.buffer.numel()}, dtype, bucket.buffer.device());
  kernels::convert(bucket.buffer, compressed);
  comm::WorkPtr work = reduce(compressed);
  return CommHookFuture(work, [buffer = bucket.buffer, compressed]() mutable { kernels::convert(compressed, buffer); });
}

}  // namespace

CommHookFuture bf16_compress(comm::ProcessGroup& group, GradBucket& bucket) {
  return reduce_compressed(bucket, DType::bf16, [&](const Tensor& compressed) {
    return group.all_reduce(compressed, comm::ReduceOp::avg, bucket.call_options());
  });
}

CommHookFuture fp16_compress(comm::ProcessGroup& group, GradBucket& bucket) {
  // The buffer's values are replaced by the result anyway: scaling them in place costs no copy.
  kernels::scale(bucket.buffer, 1.f / float(group.size()));
  return reduce_compressed(bucket, DType::f16, [&](const Tensor& compressed) {
    return group.all_reduce(compressed, comm::ReduceOp::sum, bucket.call_options());
  });
}

CommHookFuture bf16_single_rounding(comm::ProcessGroup& group, GradBucket& bucket) {
  return reduce_compressed(bucket, DType::bf16, [&](const Tensor& compressed) {
    return group.all_reduce_single_rounding(compressed, comm::ReduceOp::avg, bucket.call_options());
  });
}

namespace {

// Each built-in hook under its name: the one list names() and by_name() read.
struct NamedHook {
  const char* name;
  CommHookFuture (*hook)(comm::ProcessGroup&, GradBucket&);
};
constexpr NamedHook kBuiltIns[] = {{"allreduce", allreduce},
                                   {"bf16_compress", bf16_compress},
                                   {"fp16_compress", fp16_compress},
                                   {"bf16_single_rounding", bf16_single_rounding}};

}  // namespace

const std::vector<std::string>& names() {
  static const std::vector<std::string> all = [] {
    std::vector<std::string> out;
    for (const NamedHook& h : kBuiltIns) out.push_back(h.name);
    return out;
  }();
  return all;
}

CommHook by_name(const std::string& name) {
  for (const NamedHook& h : kBuiltIns)
    if (name == h.name) return h.hook;
  std::string valid;
  for (const std::string& n : names()) valid += (valid.empty() ? "" : ", ") + n;
  TINYDDP_FAIL("unknown comm hook '", name, "'", hint("use one of ", valid));
}

}  // namespace comm_hooks

}  // namespace tinyddp::nn
