#include "tinyddp/nn/sequential.h"

#include <sstream>

#include "tinyddp/core/error.h"
#include "tinyddp/core/trace.h"

namespace tinyddp::nn {

namespace {
// "backward 2 Linear": child `index`'s span on the trace's compute lane (built only while tracing).
std::string span_name(const char* pass, size_t index, const Module& child) {
  if (!trace::enabled()) return {};
  std::string text = child.describe();
  return std::string(pass) + " " + std::to_string(index) + " " + text.substr(0, text.find('('));
}
}  // namespace

Module& Sequential::append(std::unique_ptr<Module> child) {
  TINYDDP_CHECK(child != nullptr, "Sequential::append: the module is null", hint("pass std::make_unique<Layer>(...)"));
  // One device per model: a child built on the CPU joins a model already moved elsewhere.
  if (!children_.empty() && child->device() != device_) child->to(device_);
  if (children_.empty()) device_ = child->device();
  children_.push_back(std::move(child));
  return *children_.back();
}

Tensor Sequential::forward(const Tensor& input) {
  Tensor x = input;
  for (size_t i = 0; i < children_.size(); ++i) {
    trace::Span span(span_name("forward", i, *children_[i]), "compute");
    x = children_[i]->forward(x);
  }
  return x;
}

Tensor Sequential::backward(const Tensor& grad_output, bool want_input_grad) {
  // The reverse walk over the children is the whole backward pass: each child's parameter gradients
  // are complete (and announced through mark_grad_ready) as soon as its own backward returns, so the
  // last layer's gradients are ready first -- the order DDP's buckets are laid out in.
  Tensor grad = grad_output;
  for (size_t i = children_.size(); i-- > 0;) {
    trace::Span span(span_name("backward", i, *children_[i]), "compute");
    grad = children_[i]->backward(grad, i > 0 || want_input_grad);
  }
  return grad;
}

size_t Sequential::saved_activation_bytes() const {
  size_t bytes = 0;
  for (const auto& child : children_) bytes += child->saved_activation_bytes();
  return bytes;
}

std::string Sequential::describe() const {
  std::ostringstream out;
  out << "Sequential(";
  for (size_t i = 0; i < children_.size(); ++i) {
    // Indent nested modules' extra lines, as PyTorch's repr does.
    std::string text = children_[i]->describe(), indented;
    for (char c : text) {
      indented += c;
      if (c == '\n') indented += "  ";
    }
    out << "\n  (" << i << "): " << indented;
  }
  out << (children_.empty() ? ")" : "\n)");
  return out.str();
}

std::vector<NamedParameter> Sequential::named_parameters() {
  std::vector<NamedParameter> out;
  for (size_t i = 0; i < children_.size(); ++i)
    for (auto& named : children_[i]->named_parameters())
      out.push_back({std::to_string(i) + "." + named.name, named.parameter});
  return out;
}

void Sequential::to(Device device) {
  for (auto& child : children_) child->to(device);
  device_ = device;
}

Module& Sequential::operator[](size_t index) {
  TINYDDP_CHECK(index < children_.size(), "Sequential[", index, "]: the model has ", children_.size(), " children",
                hint("indices start at 0"));
  return *children_[index];
}

const Module& Sequential::operator[](size_t index) const {
  TINYDDP_CHECK(index < children_.size(), "Sequential[", index, "]: the model has ", children_.size(), " children",
                hint("indices start at 0"));
  return *children_[index];
}

std::vector<std::pair<std::string, Module*>> Sequential::named_children() {
  std::vector<std::pair<std::string, Module*>> out;
  for (size_t i = 0; i < children_.size(); ++i) out.emplace_back(std::to_string(i), children_[i].get());
  return out;
}

}  // namespace tinyddp::nn
