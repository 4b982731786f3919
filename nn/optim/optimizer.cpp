#include "tinyddp/nn/optim/optimizer.h"

#include <cmath>

#include "tinyddp/core/error.h"

namespace tinyddp::nn {

Optimizer::Optimizer(std::vector<NamedParameter> params, double lr)
    : params_(std::move(params)), lr_(lr), initial_lr_(lr) {
  TINYDDP_CHECK(!params_.empty(), "optimizer got an empty parameter list",
                hint("pass model.named_parameters() after the layers were added"));
  TINYDDP_CHECK(std::isfinite(lr) && lr >= 0, "invalid learning rate: ", lr, hint("use a finite lr >= 0"));
  for (size_t i = 0; i < params_.size(); ++i) {
    TINYDDP_CHECK(params_[i].parameter != nullptr, "optimizer parameter ", i, " ('", params_[i].name, "') is null",
                  hint("pass the pointers from model.named_parameters()"));
    for (size_t j = 0; j < i; ++j)
      TINYDDP_CHECK(params_[j].parameter != params_[i].parameter, "parameter '", params_[i].name,
                    "' appears twice in the optimizer's list (also as '", params_[j].name, "')",
                    hint("it would be updated twice per step -- pass each parameter once"));
  }
}

void Optimizer::zero_grad(bool set_to_none) {
  for (auto& p : params_) p.parameter->clear_grad(set_to_none);
}

void Optimizer::check_gradient(const NamedParameter& p, const char* optimizer_name) {
  const Parameter& param = *p.parameter;
  TINYDDP_CHECK(param.grad.defined() && param.grad.shape() == param.value.shape(), optimizer_name, ".step: '", p.name,
                "' has gradient ", param.grad.defined() ? param.grad.describe() : "undefined", " for value ",
                param.value.describe(), hint("gradients must keep the parameter's shape"));
  TINYDDP_CHECK(param.grad.device() == param.value.device(), optimizer_name, ".step: '", p.name, "' has its value on ",
                param.value.device().str(), " but its gradient on ", param.grad.device().str(),
                hint("move the model with Module::to before building the optimizer"));
}

}  // namespace tinyddp::nn
