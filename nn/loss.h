// Losses: the end of the forward pass and the start of the backward pass. A loss is not a Module
// (it takes two inputs and returns a number), but it follows the same explicit protocol:
//
//   float loss = criterion.forward(model.forward(x), labels);
//   model.backward(criterion.backward(), /*want_input_grad=*/false);
//
// Both reduce with the mean over the batch, PyTorch's default reduction='mean'. This matters for DDP:
// each rank's gradient is the mean over its own shard, and averaging those across ranks gives the
// gradient of the mean over the global batch (when the shards have equal sizes).
#pragma once

#include <string>

#include "tinyddp/core/tensor.h"

namespace tinyddp::nn {

class Loss {
 public:
  virtual ~Loss() = default;
  // Returns the loss and keeps d(loss)/d(output) for backward().
  virtual float forward(const Tensor& output, const Tensor& target) = 0;
  // d(loss)/d(output) of the last forward(); throws when there was none.
  virtual Tensor backward() const;
  // The loss alone, without computing or keeping a gradient (validation).
  virtual float evaluate(const Tensor& output, const Tensor& target) const = 0;
  virtual std::string describe() const = 0;

 protected:
  Tensor grad_output_;
};

// Softmax + cross-entropy over logits [batch, classes] and i64 class indices [batch]: PyTorch's
// nn.CrossEntropyLoss(). Fused: the gradient softmax(logits) - onehot(labels), divided by the batch,
// is produced in the same pass as the loss, so backward() costs nothing and no probability matrix is
// stored besides that gradient.
class CrossEntropyLoss : public Loss {
 public:
  float forward(const Tensor& logits, const Tensor& labels) override;
  float evaluate(const Tensor& logits, const Tensor& labels) const override;
  std::string describe() const override { return "CrossEntropyLoss()"; }
};

// Mean of (prediction - target)^2 over all elements: PyTorch's nn.MSELoss().
class MSELoss : public Loss {
 public:
  float forward(const Tensor& prediction, const Tensor& target) override;
  float evaluate(const Tensor& prediction, const Tensor& target) const override;
  std::string describe() const override { return "MSELoss()"; }
};

}  // namespace tinyddp::nn
