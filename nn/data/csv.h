// Reading a numeric CSV file (plain or gzip-compressed) into a TensorDataset.
//
//   // digits.csv.gz: 64 pixel counts 0..16, then the class 0..9, on each line
//   TensorDataset digits = read_csv("digits.csv.gz", {.feature_scale = 1.f / 16});
//   // digits.features(): f32 [1797, 64] in [0, 1];  digits.targets(): i64 [1797]
//
// One column is the label (the last by default); every other column is a feature. Every row must
// have the same number of columns and every field must be a finite number. A row that breaks a rule
// is an error that names the file, the line and the column and shows what was found:
//   digits.csv:17, column 65: expected a number, found "x"
// Quoted fields are not supported: this reads numbers, not general CSV.
#pragma once

#include <cstdint>
#include <string>

#include "tinyddp/nn/data/dataset.h"

namespace tinyddp::nn {

struct CsvOptions {
  // Which column holds the label: 0-based, or negative to count from the end (-1: the last).
  int64_t label_column = -1;
  // Skip the first non-empty line (column names).
  bool has_header = false;
  // Every feature is multiplied by this (digits: 1.f / 16 maps the pixel counts 0..16 onto [0, 1]).
  float feature_scale = 1.f;
  char delimiter = ',';
  // true: labels are class indices, whole numbers >= 0 ("3" or "3.0"), stored as i64 [N].
  // false: labels are real values (regression targets), stored as f32 [N].
  bool class_labels = true;
  // With class labels: how many classes the model has (digits: 10), or 0 for no upper bound. A label
  // of num_classes or more is refused at its line, instead of failing later inside the loss.
  int64_t num_classes = 0;
  // Refuse inputs beyond these sizes instead of exhausting memory on a wrong or hostile file.
  uint64_t max_bytes = uint64_t(1) << 30;  // of text, after decompression
  uint64_t max_line_bytes = uint64_t(1) << 20;
  int64_t max_columns = int64_t(1) << 16;
  // Data rows (the header not counted). The default never binds before max_bytes does (a row takes at
  // least 4 bytes of text); lower it to cap the tensors a file can make this process allocate.
  int64_t max_rows = int64_t(1) << 28;
};

// Reads `path`; files compressed with gzip (by content, whatever their name) are decompressed on the fly.
TensorDataset read_csv(const std::string& path, const CsvOptions& options = {});
// Parses CSV text already in memory; `source_name` stands for the file name in error messages.
TensorDataset parse_csv(const std::string& text, const std::string& source_name, const CsvOptions& options = {});

}  // namespace tinyddp::nn
