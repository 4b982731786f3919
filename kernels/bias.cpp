// Bias of a Linear layer: added to every row in forward, its gradient is the column sum of dy
// (every row of the batch used the same bias, so every row's gradient flows into it).
#include "tinyddp/kernels/argument_checks.h"
#include "tinyddp/kernels/cpu_column_sums.h"
#include "tinyddp/kernels/elementwise.h"
#include "tinyddp/kernels/ops.h"

#include "tinyddp/kernels/cuda_dispatch.h"

namespace tinyddp::kernels {

namespace {
// y [rows, cols] with bias [cols]: the checks shared by forward and backward.
void check_rows_and_bias(const char* op, const char* rows_arg, const Tensor& rows, const char* bias_arg,
                         const Tensor& bias) {
  detail::check_tensor(op, rows_arg, rows);
  detail::check_tensor(op, bias_arg, bias);
  detail::check_dim(op, rows_arg, rows, 2);
  detail::check_dim(op, bias_arg, bias, 1);
  detail::check_same_device(op, rows_arg, rows, bias_arg, bias);
  TINYDDP_CHECK(bias.size(0) == rows.size(1), op, ": `", bias_arg, "` is ", bias.describe(), " but `", rows_arg,
                "` is ", rows.describe(), hint("the bias needs one entry per column (", rows.size(1), ")"));
}
}  // namespace

void bias_add(Tensor& y, const Tensor& bias) {
  check_rows_and_bias("bias_add", "y", y, "bias", bias);
  const int64_t rows = y.size(0), cols = y.size(1);
  if (y.numel() == 0) return;
  if (const cuda::Kernels* gpu = cuda_kernels_for(y)) {
    gpu->bias_add(y.device().index, y.data<float>(), bias.data<float>(), rows, cols);
    return;
  }
  float* __restrict out = y.data<float>();
  const float* __restrict b = bias.data<float>();
  for (int64_t i = 0; i < rows; ++i) {
    float* __restrict row = out + i * cols;
    for (int64_t j = 0; j < cols; ++j) row[j] += b[j];
  }
}

void bias_grad(const Tensor& dy, Tensor& dbias, float beta) {
  check_rows_and_bias("bias_grad", "dy", dy, "dbias", dbias);
  const int64_t rows = dy.size(0), cols = dy.size(1);
  if (cols == 0) return;
  if (const cuda::Kernels* gpu = cuda_kernels_for(dy)) {
    gpu->bias_grad(dy.device().index, dy.data<float>(), dbias.data<float>(), rows, cols, beta);
    return;
  }
  detail::cpu_column_sums(dy.data<float>(), dbias.data<float>(), beta, rows, cols,
                          [](const float*, int64_t, int64_t, int64_t) {});
}

}  // namespace tinyddp::kernels
