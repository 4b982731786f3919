// Gradient clipping by global norm: torch.nn.utils.clip_grad_norm_ (norm_type 2).
//
// Under DDP call it after backward (when the gradients are already averaged across ranks), so every
// rank computes the same norm and scales by the same factor.
#pragma once

#include <vector>

#include "tinyddp/nn/module.h"

namespace tinyddp::nn {

// total = sqrt(sum of every gradient element squared), over all `params` that have a gradient
// (Parameter::has_grad). When
// max_norm / (total + 1e-6) < 1, every gradient is multiplied by that factor (PyTorch's formula: the
// 1e-6 keeps it finite for zero gradients). Returns the total norm before clipping.
double clip_grad_norm(const std::vector<Parameter*>& params, double max_norm);

}  // namespace tinyddp::nn
