// Linear: y = x W^T + b, with W stored as [out_features, in_features] exactly as PyTorch stores it,
// so a state_dict moves between the two without transposes.
#pragma once

#include <cstdint>
#include <string>

#include "tinyddp/core/random.h"
#include "tinyddp/nn/module.h"
#include "tinyddp/nn/precision/precision.h"

namespace tinyddp::nn {

class Linear : public Module {
 public:
  // Draws the initial weight, then the bias, from `generator` with PyTorch's distribution:
  // kaiming_uniform_(a = sqrt(5)) for the weight and U(-1/sqrt(in), 1/sqrt(in)) for the bias, which
  // both come out as U(-1/sqrt(in_features), 1/sqrt(in_features)). The numbers are Philox draws, so one
  // seed gives the same model on every device and every run (not the same numbers as PyTorch's RNG).
  Linear(int64_t in_features, int64_t out_features, Generator& generator, bool bias = true);

  // input [batch, in_features] f32 -> [batch, out_features] f32. Keeps a handle to the input for
  // backward. Under a mixed precision (nn/precision/precision.h) the input and the weight are rounded
  // to bf16 or f16 first: backward keeps the rounded input stored in that narrow type (half the bytes
  // of f32) on every device, widened again only where the GEMM takes f32 operands; the rounded weight
  // -- made here once per forward, from the f32 master weight -- serves backward's dx = dy W too.
  // Under a mixed precision the input may also be that narrow type already (kept as it is).
  Tensor forward(const Tensor& input) override;
  // grad_output [batch, out_features]. Writes db = sum_rows(dy), marks it ready, then dW = dy^T x and
  // marks it ready (each accumulated instead when the gradient already exists: see Parameter::has_grad),
  // then (if wanted) returns dx = dy W. In the precision its forward ran in: under a mixed one, dy is
  // rounded once for both GEMMs, in the pass that sums the f32 dy into db, and both GEMMs write f32
  // (the gradient buckets).
  Tensor backward(const Tensor& grad_output, bool want_input_grad = true) override;
  std::string describe() const override;
  // The kept input's bytes (the rounded weight is a copy of a parameter, not an activation).
  size_t saved_activation_bytes() const override { return input_.defined() ? input_.nbytes() : 0; }

  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }
  bool has_bias() const { return bias_ != nullptr; }
  Parameter& weight() { return *weight_; }
  Parameter& bias();  // throws when built with bias = false

 private:
  int64_t in_features_, out_features_;
  Parameter* weight_ = nullptr;  // owned by Module (heap), so these stay valid when a Linear moves
  Parameter* bias_ = nullptr;
  Tensor input_;                           // saved by forward for dW (rounded and narrow, under a mixed precision)
  Precision precision_ = Precision::fp32;  // the precision forward ran in, which backward follows
  Tensor weight_operand_;  // the weight rounded by forward, under a mixed precision; reused while its shape lasts
};

}  // namespace tinyddp::nn
