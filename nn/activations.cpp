#include "tinyddp/nn/activations.h"

#include "tinyddp/core/error.h"
#include "tinyddp/kernels/ops.h"
#include "tinyddp/nn/precision/precision.h"

namespace tinyddp::nn {

namespace {

void check_backward(const Tensor& saved_input, const Tensor& grad_output, const std::string& layer) {
  TINYDDP_CHECK(saved_input.defined(), layer, ".backward called before forward", hint("run forward first"));
  TINYDDP_CHECK(grad_output.shape() == saved_input.shape(), layer, ".backward: grad_output is ", grad_output.describe(),
                " but the forward input was ", saved_input.describe(),
                hint("pass the gradient of this layer's forward output"));
}

}  // namespace

Tensor ReLU::forward(const Tensor& input) {
  Tensor output = Tensor::empty(input.shape(), input.dtype(), input.device());
  if (is_mixed(current_precision()) && input.device().is_cpu()) {
    positive_ = Tensor::empty(input.shape(), DType::u8, input.device());
    kernels::relu_forward_masked(input, output, positive_);
    input_ = Tensor();
  } else {
    kernels::relu_forward(input, output);
    input_ = input;
    positive_ = Tensor();
  }
  return output;
}

Tensor ReLU::backward(const Tensor& grad_output, bool want_input_grad) {
  const Tensor& saved = positive_.defined() ? positive_ : input_;
  check_backward(saved, grad_output, describe());
  if (!want_input_grad) return Tensor();
  Tensor grad_input = Tensor::empty(saved.shape(), DType::f32, saved.device());
  if (positive_.defined())
    kernels::relu_backward_masked(positive_, grad_output, grad_input);
  else
    kernels::relu_backward(input_, grad_output, grad_input);
  return grad_input;
}

Tensor GELU::forward(const Tensor& input) {
  Tensor output = Tensor::empty(input.shape(), input.dtype(), input.device());
  kernels::gelu_forward(input, output);
  input_ = input;
  return output;
}

Tensor GELU::backward(const Tensor& grad_output, bool want_input_grad) {
  check_backward(input_, grad_output, describe());
  if (!want_input_grad) return Tensor();
  Tensor grad_input = Tensor::empty(input_.shape(), DType::f32, input_.device());
  kernels::gelu_backward(input_, grad_output, grad_input);
  return grad_input;
}

}  // namespace tinyddp::nn
