#include "tinyddp/nn/ddp/comm_hook.h"

#include <utility>

#include "tinyddp/core/error.h"

namespace tinyddp::nn {

CommHookFuture::CommHookFuture(comm::WorkPtr work, std::function<void()> then)
    : work_(std::move(work)), then_(std::move(then)) {
  TINYDDP_CHECK(work_ != nullptr, "CommHookFuture: the work is null; hint: return the Work of the collective the "
                "hook started (e.g. group.all_reduce(...)), or comm::Work::completed(...) when it needed none");
}

void CommHookFuture::wait() {
  TINYDDP_CHECK(work_ != nullptr, "CommHookFuture::wait: this future holds no work; hint: a comm hook must return "
                "CommHookFuture(work), not a default-constructed one");
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

}  // namespace comm_hooks

}  // namespace tinyddp::nn
