#include "tinyddp/nn/module.h"

#include <sstream>

#include "tinyddp/core/error.h"

namespace tinyddp::nn {

std::vector<NamedParameter> Module::named_parameters() {
  std::vector<NamedParameter> out;
  out.reserve(own_parameters_.size());
  for (auto& [name, parameter] : own_parameters_) out.push_back({name, parameter.get()});
  return out;
}

std::vector<Parameter*> Module::parameters() {
  std::vector<Parameter*> out;
  for (auto& named : named_parameters()) out.push_back(named.parameter);
  return out;
}

int64_t Module::parameter_count() {
  int64_t count = 0;
  for (Parameter* p : parameters()) count += p->value.numel();
  return count;
}

Parameter& Module::parameter(const std::string& name) {
  std::vector<NamedParameter> all = named_parameters();
  std::ostringstream names;
  for (auto& named : all) {
    if (named.name == name) return *named.parameter;
    names << (names.tellp() > 0 ? ", " : "") << named.name;
  }
  TINYDDP_FAIL("no parameter called '", name, "' in ", describe(), " (it has: ", names.str(), ")",
               hint("names follow PyTorch's state_dict keys, such as '0.weight'"));
}

void Module::to(Device device) {
  for (auto& [name, p] : own_parameters_) {
    p->value = p->value.to(device);
    p->grad = p->grad.to(device);
  }
  device_ = device;
}

void Module::zero_grad(bool set_to_none) {
  for (Parameter* p : parameters()) p->clear_grad(set_to_none);
}

Parameter& Module::register_parameter(const std::string& name, Tensor value) {
  TINYDDP_CHECK(value.defined(), "register_parameter('", name, "'): the value is an undefined tensor",
                hint("create it with Tensor::empty or Tensor::zeros first"));
  TINYDDP_CHECK(value.dtype() == DType::f32, "register_parameter('", name, "'): parameters are f32, got ",
                value.describe(), hint("create the tensor with DType::f32"));
  for (auto& [existing, p] : own_parameters_)
    TINYDDP_CHECK(existing != name, "register_parameter: '", name, "' is already registered in this module",
                  hint("give every parameter of a module its own name"));
  auto parameter = std::make_unique<Parameter>();
  parameter->grad = Tensor::zeros(value.shape(), value.dtype(), value.device());
  parameter->value = std::move(value);
  device_ = parameter->value.device();
  own_parameters_.emplace_back(name, std::move(parameter));
  return *own_parameters_.back().second;
}

}  // namespace tinyddp::nn
