// Activations: element-wise layers without parameters. Each saves its input in forward because its
// derivative is a function of the input.
#pragma once

#include <string>

#include "tinyddp/nn/module.h"

namespace tinyddp::nn {

// max(x, 0); the gradient passes where x > 0 (at exactly 0 it is 0, as in PyTorch).
// Under a mixed precision on the CPU it keeps, instead of its f32 input, one byte per element saying
// whether x > 0: the same gradient, bit for bit, in a quarter of the bytes.
class ReLU : public Module {
 public:
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& grad_output, bool want_input_grad = true) override;
  std::string describe() const override { return "ReLU()"; }
  size_t saved_activation_bytes() const override {
    return (input_.defined() ? input_.nbytes() : 0) + (positive_.defined() ? positive_.nbytes() : 0);
  }

 private:
  Tensor input_;     // what backward reads of x: the input itself,
  Tensor positive_;  // or (mixed precision, CPU) u8 x > 0
};

// x * Phi(x) with Phi the standard normal CDF: PyTorch's nn.GELU() (approximate='none').
class GELU : public Module {
 public:
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& grad_output, bool want_input_grad = true) override;
  std::string describe() const override { return "GELU(approximate='none')"; }
  size_t saved_activation_bytes() const override { return input_.defined() ? input_.nbytes() : 0; }

 private:
  Tensor input_;
};

}  // namespace tinyddp::nn
