// The checks every kernel runs on its arguments before touching memory, so that a wrong shape, dtype
// or device is an error naming the kernel and the argument instead of a silent out-of-bounds write.
// Internal to kernels/*.cpp.
#pragma once

#include "tinyddp/core/tensor.h"

namespace tinyddp::kernels::detail {

// `t` exists and holds `dtype`.
inline void check_tensor(const char* op, const char* arg, const Tensor& t, DType dtype = DType::f32) {
  TINYDDP_CHECK(t.defined(), op, ": argument `", arg, "` is an undefined tensor",
                hint("allocate it with Tensor::empty first"));
  TINYDDP_CHECK(t.dtype() == dtype, op, ": argument `", arg, "` is ", t.describe(), " but must be ", dtype_name(dtype),
                hint("convert it, or allocate it with DType::", dtype_name(dtype)));
}

// `t` has exactly `dims` dimensions.
inline void check_dim(const char* op, const char* arg, const Tensor& t, int64_t dims) {
  TINYDDP_CHECK(t.dim() == dims, op, ": argument `", arg, "` must have ", dims, " dimension(s), got ", t.describe(),
                hint("reshape it"));
}

// `t` lives on the same device as `ref` (all arguments of one kernel call must).
inline void check_same_device(const char* op, const char* ref_arg, const Tensor& ref, const char* arg,
                              const Tensor& t) {
  TINYDDP_CHECK(t.device() == ref.device(), op, ": argument `", arg, "` is on ", t.device().str(), " but `", ref_arg,
                "` is on ", ref.device().str(), hint("move both to one device with .to(device)"));
}

// `t` has the same shape and device as `ref` (the output of an element-wise kernel, a gradient, an
// optimizer state buffer).
inline void check_like(const char* op, const char* ref_arg, const Tensor& ref, const char* arg, const Tensor& t) {
  check_same_device(op, ref_arg, ref, arg, t);
  TINYDDP_CHECK(t.shape() == ref.shape(), op, ": argument `", arg, "` is ", t.describe(), " but `", ref_arg, "` is ",
                ref.describe(), hint("they must have the same shape"));
}

// logits [N, C] f32 and labels [N] i64 on one device: the inputs of a classification loss or metric.
inline void check_logits_and_labels(const char* op, const Tensor& logits, const Tensor& labels) {
  check_tensor(op, "logits", logits);
  check_tensor(op, "labels", labels, DType::i64);
  check_dim(op, "logits", logits, 2);
  check_dim(op, "labels", labels, 1);
  check_same_device(op, "logits", logits, "labels", labels);
  TINYDDP_CHECK(labels.size(0) == logits.size(0), op, ": `labels` is ", labels.describe(), " but `logits` is ",
                logits.describe(), hint("one label per row of logits"));
}

// The error for a class index outside [0, classes), the same whichever device found it.
[[noreturn]] inline void label_out_of_range(const char* op, int64_t row, int64_t label, int64_t classes) {
  TINYDDP_FAIL(op, ": labels[", row, "] = ", label, " is not a class index in [0, ", classes, ")",
               hint("labels must be ", "0-based class indices below the number of logits columns (", classes, ")"));
}

}  // namespace tinyddp::kernels::detail
