// Fuzz target for the CSV reader (nn/data/csv.h): text from a file nobody checked.
//
// The first input byte picks the options (delimiter, header, label column, label kind, scale); the
// rest is the text. Properties checked on every input, beyond "does not crash, leak or read out of
// bounds":
//   - parse_csv either returns a dataset or throws tinyddp::Error (never anything else);
//   - what it returns has as many rows as the text has non-blank lines (less the header), counted
//     here independently, and never more than max_rows; features [rows, columns - 1] with
//     columns <= max_columns; every feature finite; every class label >= 0.
//
// Built two ways (test/fuzz/CMakeLists.txt), as fuzz_store_frame is:
//   - with clang's libFuzzer (-DTINYDDP_LIBFUZZER), coverage-guided:
//       bin/fuzz_csv_libfuzzer -max_total_time=60
//   - with any compiler, with the seeded driver below (valid files, their mutations, random bytes),
//     a few seconds in `make test`.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "tinyddp/core/error.h"
#include "tinyddp/nn/data/csv.h"

using tinyddp::nn::CsvOptions;

namespace {

constexpr char kDelimiters[] = {',', ';', '\t', ' '};
constexpr int64_t kLabelColumns[] = {-1, 0, 1, -2};
constexpr float kScales[] = {1.f, 1.f / 16, 1e30f, -2.f};

// Small limits, so inputs of a few hundred bytes reach every bound.
CsvOptions options_from(uint8_t selector) {
  CsvOptions options;
  options.delimiter = kDelimiters[selector & 3];
  options.has_header = (selector >> 2) & 1;
  options.class_labels = (selector >> 3) & 1;
  options.label_column = kLabelColumns[(selector >> 4) & 3];
  options.feature_scale = kScales[(selector >> 6) & 3];
  options.max_bytes = 4096;
  options.max_line_bytes = 256;
  options.max_columns = 12;
  options.max_rows = 40;
  return options;
}

void require(bool condition, const char* what) {
  if (!condition) {
    std::fprintf(stderr, "fuzz_csv: property violated: %s\n", what);
    std::abort();
  }
}

// The rows a valid parse must have: lines with anything but blanks on them, less the header line.
int64_t expected_rows(std::string_view text, const CsvOptions& options) {
  int64_t lines = 0;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    bool blank = true;
    for (size_t i = start; i < end; ++i) {
      char c = text[i];
      bool is_space = (c == ' ' || c == '\t' || c == '\r') && c != options.delimiter;
      if (!is_space) blank = false;
    }
    lines += !blank;
    start = end + 1;
  }
  return lines - (options.has_header ? 1 : 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const CsvOptions options = options_from(data[0]);
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::optional<tinyddp::nn::TensorDataset> dataset;
  try {
    dataset.emplace(tinyddp::nn::parse_csv(text, "fuzz.csv", options));
  } catch (const tinyddp::Error&) {
    return 0;  // refused with a clear error: the expected outcome for most inputs
  }
  const tinyddp::Tensor& features = dataset->features();
  const tinyddp::Tensor& targets = dataset->targets();
  require(features.dim() == 2 && targets.dim() == 1, "features [N, C-1] and targets [N]");
  const int64_t rows = features.shape()[0], columns = features.shape()[1] + 1;
  require(targets.shape()[0] == rows, "as many targets as rows");
  require(rows == expected_rows(text, options), "row count differs from the non-blank lines of the text");
  require(rows >= 1 && rows <= options.max_rows, "rows outside [1, max_rows]");
  require(columns >= 2 && columns <= options.max_columns, "columns outside [2, max_columns]");
  for (float v : features.to_vector<float>()) require(std::isfinite(v), "a feature that is not finite");
  if (options.class_labels)
    for (int64_t label : targets.to_vector<int64_t>()) require(label >= 0, "a negative class label");
  else
    for (float v : targets.to_vector<float>()) require(std::isfinite(v), "a target that is not finite");
  return 0;
}

#ifndef TINYDDP_LIBFUZZER
// The seeded driver: valid files for several option sets, then mutations of them (bytes replaced
// with characters that matter to the reader, truncations, insertions, deletions, repeated lines),
// then plain random bytes.
int main(int argc, char** argv) {
  long iterations = argc > 1 ? std::atol(argv[1]) : 100000;
  std::mt19937 random(20240612);
  const std::vector<std::string> seeds = {
      std::string(1, char(0x00)) + "1,2,3,0\n4,5,6,2\n7,8,9,1\n",             // ',' class labels, last column
      std::string(1, char(0x04)) + "a,b,label\n0.5,-1e3,1\n+2,3.0e-2,0\n\n",  // ',' header
      std::string(1, char(0x09)) + "1;2;3.5\r\n4;5;-6.25\r\n",                // ';' real labels
      std::string(1, char(0x1a)) + "3\t0.25\t7\n1\t 2\t8\n",                  // '\t' label first
      std::string(1, char(0x43)) + "16 0 8 0\n 4 12 16 3\n",                  // ' ' scale 1/16
      std::string(1, char(0x80)) + "1e8,1\n-3,0\n",                           // scale 1e30: overflows
      std::string(1, char(0x28)) + "9,8,7,6\n5,4,3,2\n1,0,1,0\n",             // label column 1
  };
  static const char kAlphabet[] = "0123456789.,;+-eE \t\r\nnaifx\"";
  auto run = [](const std::string& input) {
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
  };
  long accepted = 0;
  auto accepted_by_reader = [&](const std::string& input) {
    try {
      tinyddp::nn::parse_csv(input.substr(1), "seed.csv", options_from(uint8_t(input[0])));
      return true;
    } catch (const tinyddp::Error&) {
      return false;
    }
  };
  for (const auto& seed : seeds) run(seed);
  for (long i = 0; i < iterations; ++i) {
    std::string input;
    if (i % 8 == 7) {
      input.resize(random() % 96);
      for (auto& c : input) c = char(random());
    } else {
      input = seeds[random() % seeds.size()];
      if (random() % 4 == 0) input[0] = char(random());  // the same text under other options
      int edits = 1 + random() % 4;
      for (int e = 0; e < edits && input.size() > 1; ++e) {
        size_t at = 1 + random() % (input.size() - 1);
        switch (random() % 5) {
          case 0: input[at] = kAlphabet[random() % (sizeof kAlphabet - 1)]; break;
          case 1: input.resize(at); break;
          case 2: input.insert(at, 1, kAlphabet[random() % (sizeof kAlphabet - 1)]); break;
          case 3: input.erase(at, 1); break;
          case 4: {  // repeat the text's lines, to reach the row and byte limits
            std::string text = input.substr(1);
            for (int k = random() % 12; k > 0 && input.size() < 6000; --k) input += text;
            break;
          }
        }
      }
    }
    run(input);
    if (i % 16 == 0) accepted += accepted_by_reader(input);
  }
  // Both outcomes must occur, or the mutations never reach the reader's success path.
  require(accepted > 0, "no mutated input was ever accepted");
  std::printf("fuzz_csv: %ld inputs, %ld of a sample accepted, no property violated\n", iterations + long(seeds.size()),
              accepted);
  return 0;
}
#endif
