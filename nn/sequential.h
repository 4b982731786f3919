// Sequential: children run in order in forward and in reverse in backward. This list of layers is
// tinyddp's whole "autograd tape".
//
//   Generator gen(42);
//   Sequential model;
//   model.emplace<Linear>(12, 16, gen);
//   model.emplace<ReLU>();
//   model.emplace<Linear>(16, 3, gen);
//   // parameters: "0.weight", "0.bias", "2.weight", "2.bias" -- PyTorch's nn.Sequential state_dict keys
//
// Layers are added one statement at a time on purpose: the arguments of a single call are evaluated
// in an unspecified order in C++, so a variadic constructor taking Linear(..., gen) twice could draw
// the two layers' weights in either order, and one seed would no longer mean one model.
#pragma once

#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "tinyddp/nn/module.h"

namespace tinyddp::nn {

class Sequential : public Module {
 public:
  Sequential() = default;

  // Appends a child; its parameters are named "<index>.<name>". Returns the child.
  Module& append(std::unique_ptr<Module> child);
  template <typename M, typename... Args>
  M& emplace(Args&&... args) {
    static_assert(std::is_base_of_v<Module, M>, "Sequential::emplace<M>: M must derive from nn::Module");
    auto child = std::make_unique<M>(std::forward<Args>(args)...);
    M& ref = *child;
    append(std::move(child));
    return ref;
  }

  // Runs the children in order.
  Tensor forward(const Tensor& input) override;
  // Runs the children's backward in reverse. Every child but the first is asked for its input
  // gradient (the previous layer needs it); the first gets the caller's want_input_grad.
  Tensor backward(const Tensor& grad_output, bool want_input_grad = true) override;
  // PyTorch's layout: "Sequential(\n  (0): Linear(...)\n  (1): ReLU()\n)".
  std::string describe() const override;
  // The children's, summed.
  size_t saved_activation_bytes() const override;

  std::vector<NamedParameter> named_parameters() override;
  void to(Device device) override;

  // ---- the children ----
  size_t size() const { return children_.size(); }
  bool empty() const { return children_.empty(); }
  Module& operator[](size_t index);
  const Module& operator[](size_t index) const;
  // (name, child) in order; the names are "0", "1", ... as in PyTorch's named_children().
  std::vector<std::pair<std::string, Module*>> named_children();
  auto begin() { return children_.begin(); }  // iterates std::unique_ptr<Module>
  auto end() { return children_.end(); }
  auto begin() const { return children_.cbegin(); }
  auto end() const { return children_.cend(); }

 private:
  std::vector<std::unique_ptr<Module>> children_;
};

}  // namespace tinyddp::nn
