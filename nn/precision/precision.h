// The precision policy: which number format a model's GEMMs compute in, chosen the way PyTorch users
// choose torch.autocast.
//
//   fp32   every product in f32 (the default).
//   bf16   mixed: Linear's GEMMs take bf16 operands and accumulate in f32. bf16 has f32's exponent
//          range, so nothing overflows that did not before and no loss scaling is needed.
//   fp16   mixed: the same with IEEE half operands, whose range ends at 65504 and whose smallest
//          subnormal is 2^-24: small gradients vanish unless the loss is scaled up first, large ones
//          overflow if it is scaled too far. So fp16 training needs a LossScaler (loss_scaler.h).
//
// What mixed precision changes, and what it leaves alone (docs/mixed-precision.md):
//  - the weights stay f32 "master" copies: the optimizer steps them in f32 and checkpoints hold F32.
//    Each Linear rounds its weight once per forward and keeps that copy for backward's dx = dy W;
//  - the loss, softmax, bias, activations and reductions stay f32;
//  - every GEMM writes f32 (the products are exact in f32, the sums accumulate there), so gradients
//    land in the f32 gradient buckets and DDP, ZeRO-1 and the comm hooks see what they always saw.
//
// The policy is per thread. A Trainer sets it from TrainerOptions::precision around each step; a
// hand-written loop sets it with a scope, as with torch.autocast:
//
//   {
//     nn::PrecisionScope mixed(nn::Precision::bf16);   // like: with torch.autocast("cpu", torch.bfloat16):
//     Tensor logits = model.forward(x);
//     loss = loss_fn.forward(logits, y);
//   }
//   model.backward(loss_fn.backward());               // backward computes in the precision of its forward
#pragma once

#include <string>
#include <string_view>

#include "tinyddp/core/device.h"
#include "tinyddp/core/dtype.h"

namespace tinyddp::nn {

enum class Precision { fp32, bf16, fp16 };

// "fp32", "bf16", "fp16": the words parse_precision reads and --precision takes.
const char* precision_name(Precision precision);
// The word as a Precision; anything else is an error naming `where` (a flag, a variable), the text
// and the words allowed. Case is ignored; "bfloat16", "float16", "half" and "float32" are accepted too.
Precision parse_precision(std::string_view text, std::string_view where = "precision");
// The narrow dtype of the GEMM operands: bf16, f16, or f32 for fp32.
DType operand_dtype(Precision precision);
// True for bf16 and fp16 (the GEMMs take narrow operands).
inline bool is_mixed(Precision precision) { return precision != Precision::fp32; }
// True for fp16: its gradients need a LossScaler.
inline bool needs_loss_scaling(Precision precision) { return precision == Precision::fp16; }

// The calling thread's policy (fp32 unless a PrecisionScope says otherwise).
Precision current_precision();

// Sets the calling thread's policy for its lifetime, and restores the one before it when it ends
// (scopes nest, as autocast regions do). Not copyable or movable: it belongs to one block of one thread.
class PrecisionScope {
 public:
  explicit PrecisionScope(Precision precision);
  ~PrecisionScope();
  PrecisionScope(const PrecisionScope&) = delete;
  PrecisionScope& operator=(const PrecisionScope&) = delete;

 private:
  Precision previous_;
};

// Which units compute a GEMM under `precision` on `device`, in words: "oneDNN's bf16 matmul on
// avx512_core_amx (AMX tiles)", "no bf16 units on this CPU (oneDNN runs avx2): operands rounded to
// bf16, products in the f32 GEMM (OpenBLAS Haswell)", "cuBLAS, CUDA_R_16BF in, CUBLAS_COMPUTE_32F".
std::string precision_units(Precision precision, Device device);
// Logs precision_units once per process and precision (info level): what a run says at its start.
void announce_precision(Precision precision, Device device);

}  // namespace tinyddp::nn
