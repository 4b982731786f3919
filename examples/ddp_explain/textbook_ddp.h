// DistributedDataParallel as a textbook writes it: the algorithm before its optimisations.
//
// Every rank trains the same model on its own share of the batch, then the ranks average their
// gradients, so every rank takes the same optimizer step and the replicas never drift apart:
//   1. at the start every rank takes rank 0's weights;
//   2. one flat bucket holds every gradient: each param.grad is a view into it, so backward writes
//      into the buffer that is sent, and the average lands in param.grad with no copy;
//   3. a hook per parameter (Parameter::mark_grad_ready, nn/module.h) counts the gradients as backward
//      finishes them; the last one starts all_reduce(bucket, avg), asynchronously;
//   4. before the optimizer step, a wait for that all-reduce.
// The Reducer (nn/ddp/reducer.h) adds the optimisations: several buckets, so that communication
// starts while backward still runs, laid out again in the order gradients really arrive; checks that
// name the parameter; no_sync, unused parameters, comm hooks. Each element is still one sum over the
// ranks divided by their number, so with an all-reduce whose order of addition does not depend on
// where a bucket starts (the direct exchange: rank 0's value, then rank 1's, ...) the weights are
// the Reducer's to the last bit (test/examples/test_ddp_explain.cpp).
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "tinyddp/comm/process_group.h"
#include "tinyddp/core/error.h"
#include "tinyddp/nn/module.h"

namespace tinyddp::examples {

class TextbookDdp {
 public:
  // Collective: every rank of `group` constructs it at the same point. The model must outlive it.
  TextbookDdp(nn::Module& model, std::shared_ptr<comm::ProcessGroup> group)
      : model_(model),
        group_(std::move(group)),
        parameters_(model.parameters()),
        bucket_(Tensor::zeros({model.parameter_count()}, DType::f32, model.device())) {  // 2
    int64_t offset = 0;
    for (nn::Parameter* p : parameters_) {
      group_->broadcast(p->value, 0)->wait();  // 1
      p->grad = bucket_.view(offset, p->value.shape());
      offset += p->value.numel();
      p->grad_ready_hooks.push_back([this](nn::Parameter&) {  // 3
        if (--pending_ == 0) work_ = group_->all_reduce(bucket_, comm::ReduceOp::avg);
      });
    }
  }
  ~TextbookDdp() {
    for (nn::Parameter* p : parameters_) p->grad_ready_hooks.pop_back();  // ours, the last one added
  }
  TextbookDdp(const TextbookDdp&) = delete;  // the hooks point at this object
  TextbookDdp& operator=(const TextbookDdp&) = delete;

  Tensor forward(const Tensor& input) {
    pending_ = parameters_.size();  // every gradient is expected again
    return model_.forward(input);
  }
  // The model's own backward: the all-reduce starts inside it, when the last gradient is ready.
  void backward(const Tensor& grad_output) { model_.backward(grad_output, /*want_input_grad=*/false); }
  void wait_for_gradients() {  // 4
    TINYDDP_CHECK(work_ != nullptr, "TextbookDdp: no all-reduce to wait for", hint("forward, then backward"));
    work_->wait();
    work_ = nullptr;
  }
  const Tensor& bucket() const { return bucket_; }

 private:
  nn::Module& model_;
  std::shared_ptr<comm::ProcessGroup> group_;
  std::vector<nn::Parameter*> parameters_;
  Tensor bucket_;
  size_t pending_ = 0;  // gradients not yet ready in this backward
  comm::WorkPtr work_;  // the bucket's all-reduce, once started
};

}  // namespace tinyddp::examples
