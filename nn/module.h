// Module: a layer with explicit forward and backward, and named parameters.
//
// tinyddp has no general autograd. A model is a list of layers, and that list *is* the tape:
// backward walks it in reverse, each layer turning the gradient of its output into the gradient of
// its input and accumulating the gradients of its own parameters. The moment a layer has finished
// its parameters' gradients, it calls Parameter::mark_grad_ready(), which runs the parameter's
// hooks. That is exactly where PyTorch's autograd fires DDP's per-parameter hook, and it is where
// our Reducer (nn/ddp) hooks in to start all-reducing a bucket while backward goes on.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tinyddp/core/tensor.h"

namespace tinyddp::nn {

struct Parameter {
  Tensor value;
  // Same shape as value. Backward *accumulates* into it (as PyTorch's .grad does), except for the
  // first backward after zero_grad(), which overwrites it (see has_grad). DDP rebinds it to a view into
  // a flat bucket buffer, so it must be written in place, never reassigned by layers.
  Tensor grad;
  // PyTorch's `param.grad is not None`. zero_grad() (set_to_none, PyTorch 2's default) only clears this
  // flag: the buffer keeps stale numbers, which the next backward overwrites (GEMM with beta = 0)
  // instead of adding to them. That saves a memset of every gradient per step and a read of it in
  // the first accumulation. While it is false, grad's contents mean nothing: optimizers skip the
  // parameter, as PyTorch's skip a None gradient.
  bool has_grad = false;
  // Run by mark_grad_ready(), in registration order, each time backward has finished this gradient.
  std::vector<std::function<void(Parameter&)>> grad_ready_hooks;

  void mark_grad_ready() {
    for (auto& hook : grad_ready_hooks) hook(*this);
  }

  // For a layer about to write this gradient: the `beta` to pass to the kernel (out = beta*out + new):
  // 0 when there is no gradient yet (overwrite the stale buffer), 1 when there is (accumulate, which
  // is what makes gradient accumulation and DDP's no_sync() work). From then on the gradient exists.
  float begin_grad_write() {
    const float beta = has_grad ? 1.f : 0.f;
    has_grad = true;
    return beta;
  }

  // zero_grad for one parameter. set_to_none (the default, as in PyTorch 2): forget the gradient
  // (O(1), see has_grad). Otherwise write zeros into it in place (PyTorch 1's default; the gradient,
  // if there was one, is then a zero tensor).
  void clear_grad(bool set_to_none = true) {
    if (set_to_none) {
      has_grad = false;
    } else if (has_grad) {
      grad.zero_();
    }
  }
};

// A parameter with its full name as PyTorch would print it: "0.weight", "2.bias", ...
struct NamedParameter {
  std::string name;
  Parameter* parameter;
};

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  // Parameters live on the heap (see own_parameters_), so moving a module keeps every Parameter* --
  // and every hook DDP registered on it -- valid. Copying is not offered: two modules sharing
  // gradients would be a trap.
  Module(Module&&) = default;
  Module& operator=(Module&&) = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Computes the output and remembers what backward will need (the input, or the output).
  virtual Tensor forward(const Tensor& input) = 0;
  // Given d(loss)/d(output), accumulates the parameters' gradients, marks them ready, and returns
  // d(loss)/d(input) -- or an undefined tensor when want_input_grad is false (the first layer of a
  // model: nobody needs the gradient of the data, and skipping it saves a whole GEMM).
  virtual Tensor backward(const Tensor& grad_output, bool want_input_grad = true) = 0;
  // A short description: "Linear(in_features=10, out_features=2, bias=True)".
  virtual std::string describe() const = 0;
  // The bytes of the tensors the last forward kept for backward (the activations), as they are stored:
  // what a mixed precision's narrow storage saves is read here.
  virtual size_t saved_activation_bytes() const { return 0; }

  // Parameters in registration order, with names relative to this module ("weight", "0.bias").
  virtual std::vector<NamedParameter> named_parameters();
  std::vector<Parameter*> parameters();
  // Total number of scalars in all parameters.
  int64_t parameter_count();
  // The parameter called `name` (as named_parameters() names it); throws listing the names that exist.
  Parameter& parameter(const std::string& name);

  // Moves parameters (and their gradients) to `device`. Call it before wrapping the model in DDP:
  // moving replaces the gradient tensors that DDP's buckets would otherwise be viewing.
  virtual void to(Device device);
  Device device() const { return device_; }
  // Clears every gradient: by default forgets them (set_to_none, PyTorch 2's default: the next
  // backward overwrites instead of accumulating), or writes zeros in place. DDP's bucket views stay
  // valid either way.
  void zero_grad(bool set_to_none = true);

 protected:
  // Registers a parameter owned by this module; its gradient buffer starts as zeros of the same shape,
  // with has_grad false (PyTorch's .grad starts as None).
  Parameter& register_parameter(const std::string& name, Tensor value);

  Device device_ = Device::cpu();

 private:
  std::vector<std::pair<std::string, std::unique_ptr<Parameter>>> own_parameters_;
};

}  // namespace tinyddp::nn
