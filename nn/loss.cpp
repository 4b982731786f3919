#include "tinyddp/nn/loss.h"

#include "tinyddp/core/error.h"
#include "tinyddp/kernels/ops.h"

namespace tinyddp::nn {

Tensor Loss::backward() const {
  TINYDDP_CHECK(grad_output_.defined(), describe(), ".backward called before forward",
                hint("compute the loss with forward(output, target) first"));
  return grad_output_;
}

float CrossEntropyLoss::forward(const Tensor& logits, const Tensor& labels) {
  // A fresh gradient tensor each time: the model's backward may still hold the previous one.
  Tensor grad = Tensor::empty(logits.shape(), DType::f32, logits.device());
  float loss = kernels::softmax_cross_entropy(logits, labels, &grad);
  grad_output_ = grad;
  return loss;
}

float CrossEntropyLoss::evaluate(const Tensor& logits, const Tensor& labels) const {
  return kernels::softmax_cross_entropy(logits, labels, nullptr);
}

float MSELoss::forward(const Tensor& prediction, const Tensor& target) {
  Tensor grad = Tensor::empty(prediction.shape(), DType::f32, prediction.device());
  float loss = kernels::mse(prediction, target, &grad);
  grad_output_ = grad;
  return loss;
}

float MSELoss::evaluate(const Tensor& prediction, const Tensor& target) const {
  return kernels::mse(prediction, target, nullptr);
}

}  // namespace tinyddp::nn
