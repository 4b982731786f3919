// Accuracy: how many rows of a batch the classifier got right (its largest logit is the label).
// A metric, not a loss: no gradient, and the count is exact.
#include "tinyddp/kernels/argument_checks.h"
#include "tinyddp/kernels/ops.h"

#include "tinyddp/kernels/cuda_dispatch.h"

namespace tinyddp::kernels {

int64_t count_correct(const Tensor& logits, const Tensor& labels) {
  constexpr const char* op = "count_correct";
  detail::check_logits_and_labels(op, logits, labels);
  const int64_t rows = logits.size(0), classes = logits.size(1);
  if (rows == 0) return 0;
  TINYDDP_CHECK(classes > 0, op, ": `logits` ", logits.describe(), " has no classes",
                hint("logits need one column per class"));

  if (const cuda::Kernels* gpu = cuda_kernels_for(logits)) {
    int64_t bad_row = -1;
    int64_t correct = gpu->count_correct(logits.device().index, logits.data<float>(), labels.data<int64_t>(), rows,
                                         classes, &bad_row);
    if (bad_row >= 0)
      detail::label_out_of_range(op, bad_row, labels.slice_rows(bad_row, bad_row + 1).to_vector<int64_t>()[0], classes);
    return correct;
  }

  const float* x = logits.data<float>();
  const int64_t* y = labels.data<int64_t>();
  int64_t correct = 0;
  for (int64_t i = 0; i < rows; ++i) {
    if (y[i] < 0 || y[i] >= classes) detail::label_out_of_range(op, i, y[i], classes);
    const float* row = x + i * classes;
    int64_t best = 0;  // strict > keeps the first of equal maxima, as torch.argmax does
    for (int64_t j = 1; j < classes; ++j)
      if (row[j] > row[best]) best = j;
    correct += best == y[i];
  }
  return correct;
}

}  // namespace tinyddp::kernels
