#include "tinyddp/nn/data/dataset.h"

#include <cstring>

#include "tinyddp/core/error.h"

namespace tinyddp::nn {

namespace {

// An uninitialised tensor for `batch_size` samples shaped like `sample`.
Tensor stacked_like(const Tensor& sample, int64_t batch_size) {
  Shape shape{batch_size};
  shape.insert(shape.end(), sample.shape().begin(), sample.shape().end());
  return Tensor::empty(shape, sample.dtype());
}

void check_same_layout(const Tensor& sample, const Tensor& first, const char* what, int64_t index) {
  TINYDDP_CHECK(sample.defined() && sample.shape() == first.shape() && sample.dtype() == first.dtype(),
                "Dataset::get_batch: sample ", index, " has ", what, " ", sample.describe(),
                " but the batch's first sample has ", first.describe(),
                hint("every sample of a dataset must have the same shapes and dtypes to be batched"));
}

}  // namespace

Batch Dataset::get_batch(const std::vector<int64_t>& indices) const {
  TINYDDP_CHECK(!indices.empty(), "Dataset::get_batch: the list of indices is empty",
                hint("ask for at least one sample"));
  const int64_t batch_size = int64_t(indices.size());
  Batch first = get(indices[0]);
  TINYDDP_CHECK(first.inputs.defined() && first.targets.defined(), "Dataset::get(", indices[0],
                ") returned an undefined tensor", hint("get() must fill both inputs and targets"));
  Batch out{stacked_like(first.inputs, batch_size), stacked_like(first.targets, batch_size)};
  for (int64_t row = 0; row < batch_size; ++row) {
    Batch sample = row == 0 ? first : get(indices[size_t(row)]);
    check_same_layout(sample.inputs, first.inputs, "inputs", indices[size_t(row)]);
    check_same_layout(sample.targets, first.targets, "targets", indices[size_t(row)]);
    out.inputs.slice_rows(row, row + 1).copy_from(sample.inputs);
    out.targets.slice_rows(row, row + 1).copy_from(sample.targets);
  }
  return out;
}

TensorDataset::TensorDataset(Tensor features, Tensor targets)
    : features_(std::move(features)), targets_(std::move(targets)) {
  TINYDDP_CHECK(features_.defined() && features_.dtype() == DType::f32 && features_.dim() >= 2,
                "TensorDataset: features must be f32 [N, D], got ", features_.describe(),
                hint("one row per sample, converted to f32"));
  TINYDDP_CHECK(targets_.defined() && targets_.dim() >= 1 && targets_.size(0) == features_.size(0),
                "TensorDataset: targets ", targets_.describe(), " do not have one row per sample of features ",
                features_.describe(), hint("targets need the same first dimension N"));
  TINYDDP_CHECK((targets_.dtype() == DType::i64 && targets_.dim() == 1) || targets_.dtype() == DType::f32,
                "TensorDataset: targets must be class indices i64 [N] or values f32 [N, K], got ", targets_.describe(),
                hint("use i64 [N] for classification and f32 for regression"));
  TINYDDP_CHECK(features_.device().is_cpu() && targets_.device().is_cpu(), "TensorDataset: features ",
                features_.describe(), " and targets ", targets_.describe(), " must be on the CPU",
                hint("batches are built on the CPU, move each batch to the device instead"));
}

Batch TensorDataset::get(int64_t index) const {
  TINYDDP_CHECK(index >= 0 && index < size(), "TensorDataset::get(", index, ") is outside the dataset of ", size(),
                " samples", hint("indices run from 0 to size() - 1"));
  Shape input_shape(features_.shape().begin() + 1, features_.shape().end());
  Shape target_shape(targets_.shape().begin() + 1, targets_.shape().end());
  return {features_.slice_rows(index, index + 1).reshape(input_shape).clone(),
          targets_.slice_rows(index, index + 1).reshape(target_shape).clone()};
}

Batch TensorDataset::get_batch(const std::vector<int64_t>& indices) const {
  TINYDDP_CHECK(!indices.empty(), "TensorDataset::get_batch: the list of indices is empty",
                hint("ask for at least one sample"));
  const int64_t batch_size = int64_t(indices.size());
  for (size_t i = 0; i < indices.size(); ++i)
    TINYDDP_CHECK(indices[i] >= 0 && indices[i] < size(), "TensorDataset::get_batch: index ", indices[i], " (position ",
                  i, " of the batch) is outside the dataset of ", size(), " samples",
                  hint("indices run from 0 to size() - 1"));
  // Same shapes as the dataset's tensors, with batch_size rows.
  auto rows_like = [&](const Tensor& source) {
    Shape shape = source.shape();
    shape[0] = batch_size;
    return Tensor::empty(shape, source.dtype());
  };
  Batch out{rows_like(features_), rows_like(targets_)};
  // A gather: row i of the batch is row indices[i] of the dataset, copied as raw bytes.
  auto gather = [&](const Tensor& source, Tensor& destination) {
    const size_t row_bytes = source.nbytes() / size_t(source.size(0));
    if (row_bytes == 0) return;
    const char* from = static_cast<const char*>(source.raw_data());
    char* to = static_cast<char*>(destination.raw_data());
    for (size_t i = 0; i < indices.size(); ++i)
      std::memcpy(to + i * row_bytes, from + size_t(indices[i]) * row_bytes, row_bytes);
  };
  gather(features_, out.inputs);
  gather(targets_, out.targets);
  return out;
}

}  // namespace tinyddp::nn
