// Helpers for the DistributedDataParallel suites: threads acting as ranks (from the collective tests),
// small models, one training step, and a ProcessGroup that records the all-reduces it forwards.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "tinyddp/comm/process_group.h"
#include "tinyddp/core/random.h"
#include "tinyddp/nn/activations.h"
#include "tinyddp/nn/linear.h"
#include "tinyddp/nn/loss.h"
#include "tinyddp/nn/sequential.h"
#include "test/comm/test_collectives_support.h"

namespace tinyddp::testing {

// Every collective in these suites is bounded: a Reducer bug that leaves a rank waiting fails the
// test after this long instead of hanging it.
inline std::vector<std::shared_ptr<comm::ProcessGroup>> make_test_groups(int world) {
  comm::ProcessGroupOptions options;
  options.timeout = std::chrono::seconds(60);
  return make_groups(world, options);
}

// Linear layers of the given widths with ReLU between them, as the examples build their MLPs.
inline std::unique_ptr<nn::Sequential> make_mlp(const std::vector<int64_t>& widths, uint64_t seed) {
  Generator gen(seed);
  auto model = std::make_unique<nn::Sequential>();
  for (size_t i = 0; i + 1 < widths.size(); ++i) {
    model->emplace<nn::Linear>(widths[i], widths[i + 1], gen);
    if (i + 2 < widths.size()) model->emplace<nn::ReLU>();
  }
  return model;
}

// Uniform features in [-1, 1) and class labels, from a seed.
inline Tensor random_features(int64_t rows, int64_t cols, uint64_t seed) {
  Generator gen(seed);
  Tensor x = Tensor::empty({rows, cols});
  fill_uniform(x, -1.f, 1.f, gen);
  return x;
}
inline Tensor random_labels(int64_t rows, int64_t classes, uint64_t seed) {
  Generator gen(seed);
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < rows; ++i) labels.push_back(int64_t(gen.next_below(uint64_t(classes))));
  return Tensor::from_vector(labels);
}

// Rows `indices` of a 2-D tensor (or elements of a 1-D one), copied.
template <typename T>
Tensor gather_rows(const Tensor& t, const std::vector<int64_t>& indices) {
  const int64_t width = t.dim() == 1 ? 1 : t.size(1);
  std::vector<T> all = t.to_vector<T>(), out;
  for (int64_t i : indices) out.insert(out.end(), all.begin() + i * width, all.begin() + (i + 1) * width);
  return t.dim() == 1 ? Tensor::from_vector(out) : Tensor::from_vector(out, {int64_t(indices.size()), width});
}

// forward + cross-entropy + backward through `model` (a plain module or a DistributedDataParallel).
inline float train_step_backward(nn::Module& model, const Tensor& x, const Tensor& labels) {
  nn::CrossEntropyLoss criterion;
  float loss = criterion.forward(model.forward(x), labels);
  model.backward(criterion.backward(), /*want_input_grad=*/false);
  return loss;
}

// Every parameter's values (or gradients), concatenated in registration order.
inline std::vector<float> flat_values(nn::Module& model) {
  std::vector<float> out;
  for (nn::Parameter* p : model.parameters()) {
    std::vector<float> v = p->value.to_vector<float>();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}
inline std::vector<float> flat_grads(nn::Module& model) {
  std::vector<float> out;
  for (nn::Parameter* p : model.parameters()) {
    std::vector<float> g = p->grad.to_vector<float>();
    out.insert(out.end(), g.begin(), g.end());
  }
  return out;
}

// What `world` ranks of DDP leave in every gradient, computed in one process with the same roundings in
// the same order: each rank's backward passes run separately on `model` (`rank_backward(r)`, from a
// zero_grad, so every GEMM has the shape that rank's GEMMs have), then the ranks' gradients are summed
// in rank order in f32 and divided by the world size, as ReduceOp::avg does (comm/reduce_op.cpp: the
// f32 sum, then one division). A parameter a rank left without a gradient counts as zeros, as
// find_unused_parameters fills it. For two ranks the result is exact bit for bit, whatever order the
// all-reduce adds in (a + b == b + a in IEEE arithmetic); with more, the ring adds each chunk starting
// at another rank, and only a tolerance can compare.
template <typename RankBackward>
std::vector<float> gradients_as_ddp_averages(nn::Module& model, int world, RankBackward rank_backward) {
  std::vector<float> sum;
  for (int r = 0; r < world; ++r) {
    model.zero_grad();
    rank_backward(r);
    std::vector<float> mine;
    for (nn::Parameter* p : model.parameters()) {
      std::vector<float> g = p->has_grad ? p->grad.to_vector<float>()
                                         : std::vector<float>(size_t(p->value.numel()), 0.f);
      mine.insert(mine.end(), g.begin(), g.end());
    }
    if (r == 0) {
      sum = mine;
    } else {
      for (size_t i = 0; i < sum.size(); ++i) sum[i] = sum[i] + mine[i];
    }
  }
  const float divisor = float(world);
  for (float& s : sum) s = s / divisor;
  return sum;
}

// Writes `flat` (every gradient, in registration order, as flat_grads returns them) into the model's
// gradients, so that an optimizer steps on them.
inline void set_flat_grads(nn::Module& model, const std::vector<float>& flat) {
  size_t at = 0;
  for (nn::Parameter* p : model.parameters()) {
    const size_t n = size_t(p->value.numel());
    REQUIRE(at + n <= flat.size());
    p->begin_grad_write();
    std::copy(flat.begin() + std::ptrdiff_t(at), flat.begin() + std::ptrdiff_t(at + n), p->grad.data<float>());
    at += n;
  }
  REQUIRE(at == flat.size());
}

// A ProcessGroup that forwards to a real one and writes down each all-reduce it was asked for (which
// buffer, in which order), so a test can see what the Reducer launched and when.
class RecordingGroup : public comm::ProcessGroup {
 public:
  explicit RecordingGroup(std::shared_ptr<comm::ProcessGroup> inner)
      : ProcessGroup(inner->rank(), inner->size()), inner_(std::move(inner)) {}

  struct Call {
    const void* data;  // the first byte all-reduced
    int64_t numel;
    comm::ReduceOp op;
  };
  std::vector<Call> all_reduces;

  std::string backend() const override { return inner_->backend(); }
  comm::WorkPtr all_reduce(const Tensor& tensor, comm::ReduceOp op, const comm::CallOptions& call) override {
    all_reduces.push_back({tensor.raw_data(), tensor.numel(), op});
    return inner_->all_reduce(tensor, op, call);
  }
  comm::WorkPtr all_reduce_into(const Tensor& output, const Tensor& input, comm::ReduceOp op,
                                const comm::CallOptions& call) override {
    return inner_->all_reduce_into(output, input, op, call);
  }
  comm::WorkPtr all_reduce_coalesced(const std::vector<Tensor>& tensors, comm::ReduceOp op,
                                     const comm::CallOptions& call) override {
    return inner_->all_reduce_coalesced(tensors, op, call);
  }
  comm::WorkPtr broadcast(const Tensor& tensor, int root, const comm::CallOptions& call) override {
    return inner_->broadcast(tensor, root, call);
  }
  comm::WorkPtr all_gather(const Tensor& output, const Tensor& input, const comm::CallOptions& call) override {
    return inner_->all_gather(output, input, call);
  }
  comm::WorkPtr reduce_scatter(const Tensor& output, const Tensor& input, comm::ReduceOp op,
                               const comm::CallOptions& call) override {
    return inner_->reduce_scatter(output, input, op, call);
  }
  comm::WorkPtr barrier(const comm::CallOptions& call) override { return inner_->barrier(call); }

 private:
  std::shared_ptr<comm::ProcessGroup> inner_;
};

// A module whose backward marks its parameters ready in a scripted order (possibly leaving some out,
// or marking one twice), adding `rank + 1` to each gradient it marks: the test then knows exactly
// what every gradient must average to.
class ScriptedModule : public nn::Module {
 public:
  ScriptedModule(const std::vector<int64_t>& sizes, int rank) : rank_(rank) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      std::string name = "p";
      name += std::to_string(i);
      parameters_.push_back(&register_parameter(name, Tensor::zeros({sizes[i]})));
    }
  }
  std::vector<size_t> mark_order;
  // Called after each mark with the position in mark_order (to look at the reducer mid-backward).
  std::function<void(size_t)> after_mark;

  Tensor forward(const Tensor& input) override { return input; }
  Tensor backward(const Tensor& grad_output, bool) override {
    for (size_t k = 0; k < mark_order.size(); ++k) {
      nn::Parameter& p = *parameters_[mark_order[k]];
      float* g = p.grad.data<float>();
      const float beta = p.begin_grad_write();  // 0 after zero_grad: the buffer holds stale numbers
      for (int64_t i = 0; i < p.grad.numel(); ++i) g[i] = (beta == 0.f ? 0.f : g[i]) + float(rank_ + 1);
      p.mark_grad_ready();
      if (after_mark) after_mark(k);
    }
    return grad_output;
  }
  std::string describe() const override { return "ScriptedModule"; }
  nn::Parameter& param(size_t i) { return *parameters_[i]; }

 private:
  int rank_;
  std::vector<nn::Parameter*> parameters_;
};

}  // namespace tinyddp::testing
