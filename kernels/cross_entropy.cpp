// Softmax + cross-entropy, fused: the loss of a classifier and its gradient in one pass per row.
//
// Computing softmax first and then the loss would store the probability matrix and take log() of
// values that may have rounded to 0. Working from logsumexp instead is stable for any logits, and the
// gradient softmax - onehot falls out of the same row pass (kernels/elementwise.h has the formulas).
#include "tinyddp/kernels/argument_checks.h"
#include "tinyddp/kernels/elementwise.h"
#include "tinyddp/kernels/ops.h"

#include "tinyddp/kernels/cuda_dispatch.h"

namespace tinyddp::kernels {

namespace {

// The loss of one row; when d is non-null it receives the row's gradient (d may alias x).
float cross_entropy_row(const float* x, int64_t label, float* d, int64_t classes, float inv_batch) {
  float row_max = x[0];
  for (int64_t j = 1; j < classes; ++j) row_max = x[j] > row_max ? x[j] : row_max;
  const float label_logit = x[label];  // read before d (which may be x) is overwritten
  float normaliser = 0.f;
  if (d == nullptr) {
    for (int64_t j = 0; j < classes; ++j) normaliser += softmax_numerator(x[j], row_max);
  } else {
    // The numerators are parked in d, then turned into the gradient: exp() once per element and no
    // separate probability buffer.
    for (int64_t j = 0; j < classes; ++j) {
      d[j] = softmax_numerator(x[j], row_max);
      normaliser += d[j];
    }
    const float inv_normaliser = 1.f / normaliser;
    for (int64_t j = 0; j < classes; ++j) d[j] = cross_entropy_grad(d[j], inv_normaliser, j == label, inv_batch);
  }
  return cross_entropy_row_loss(row_max, normaliser, label_logit);
}

}  // namespace

float softmax_cross_entropy(const Tensor& logits, const Tensor& labels, Tensor* dlogits) {
  constexpr const char* op = "softmax_cross_entropy";
  detail::check_logits_and_labels(op, logits, labels);
  if (dlogits) {
    detail::check_tensor(op, "dlogits", *dlogits);
    detail::check_like(op, "logits", logits, "dlogits", *dlogits);
  }
  const int64_t rows = logits.size(0), classes = logits.size(1);
  TINYDDP_CHECK(rows > 0, op, ": `logits` ", logits.describe(),
                " has no rows, and the mean over an empty batch is "
                "undefined",
                hint("skip empty batches"));
  TINYDDP_CHECK(classes > 0, op, ": `logits` ", logits.describe(), " has no classes",
                hint("logits need one column per class"));
  float* d = dlogits ? dlogits->data<float>() : nullptr;

  if (const cuda::Kernels* gpu = cuda_kernels_for(logits)) {
    int64_t bad_row = -1;
    double loss = gpu->softmax_cross_entropy(logits.device().index, logits.data<float>(), labels.data<int64_t>(), d,
                                             rows, classes, &bad_row);
    if (bad_row >= 0)
      detail::label_out_of_range(op, bad_row, labels.slice_rows(bad_row, bad_row + 1).to_vector<int64_t>()[0], classes);
    return float(loss);
  }

  const float* x = logits.data<float>();
  const int64_t* y = labels.data<int64_t>();
  // Every label is checked before anything is written, so a bad batch leaves dlogits untouched.
  for (int64_t i = 0; i < rows; ++i)
    if (y[i] < 0 || y[i] >= classes) detail::label_out_of_range(op, i, y[i], classes);
  const float inv_batch = 1.f / float(rows);
  double loss_sum = 0.0;  // a batch of thousands of rows: summed in double, divided once
  for (int64_t i = 0; i < rows; ++i)
    loss_sum += cross_entropy_row(x + i * classes, y[i], d ? d + i * classes : nullptr, classes, inv_batch);
  return float(loss_sum / double(rows));
}

}  // namespace tinyddp::kernels
