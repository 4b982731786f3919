#include "tinyddp/nn/data/csv.h"

#include <zlib.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string_view>
#include <vector>

#include "tinyddp/core/error.h"

namespace tinyddp::nn {

namespace {

// Reads the whole file as text. zlib's gz* functions read gzip files and plain files alike (a file
// without the gzip magic bytes is passed through), so one path serves .csv and .csv.gz.
// The CSV files in `directory`, for the hint when a directory is given where a file was meant.
std::string csv_files_in(const std::string& directory) {
  std::string names;
  std::error_code error;
  int shown = 0;
  for (const auto& entry : std::filesystem::directory_iterator(directory, error)) {
    const std::string name = entry.path().filename().string();
    if (!name.ends_with(".csv") && !name.ends_with(".csv.gz")) continue;
    if (shown++ == 3) return names + ", ...";
    names += (names.empty() ? "" : ", ") + entry.path().string();
  }
  return names;
}

std::string read_text(const std::string& path, uint64_t max_bytes) {
  // gzopen opens a directory without a word; the read then fails as if the file were damaged.
  std::error_code not_there;
  if (std::filesystem::is_directory(path, not_there)) {
    const std::string found = csv_files_in(path);
    TINYDDP_FAIL(path, " is a directory, not a CSV file",
                 hint(found.empty() ? "name the .csv or .csv.gz file to read (there is none in it)"
                                    : "name the file to read: " + found));
  }
  errno = 0;
  gzFile file = gzopen(path.c_str(), "rb");
  TINYDDP_CHECK(file != nullptr, "cannot open ", path, ": ", errno ? std::strerror(errno) : "out of memory",
                hint("check the path and the file's permissions"));
  struct Closer {
    gzFile file;
    ~Closer() { gzclose(file); }
  } closer{file};
  gzbuffer(file, 1 << 17);
  std::string text;
  std::vector<char> chunk(1 << 16);
  for (;;) {
    int n = gzread(file, chunk.data(), unsigned(chunk.size()));
    if (n <= 0) break;
    TINYDDP_CHECK(text.size() + size_t(n) <= max_bytes, path, " holds more than ", max_bytes,
                  " bytes of text (after decompression)", hint("raise CsvOptions::max_bytes if the file is right"));
    text.append(chunk.data(), size_t(n));
  }
  // A read error, corrupt gzip data, or a gzip stream cut short ("unexpected end of file").
  int code = Z_OK;
  const char* message = gzerror(file, &code);
  // Z_ERRNO: the system could not read it (an I/O error); anything else: zlib found the data bad.
  TINYDDP_CHECK(code == Z_OK, "reading ", path, " failed: ", code == Z_ERRNO ? std::strerror(errno) : message,
                hint(code == Z_ERRNO ? "the disk or file system failed to read it (dmesg may say why)"
                                     : "the file is damaged or truncated (test it with gzip -t)"));
  return text;
}

bool is_blank(char c, char delimiter) { return (c == ' ' || c == '\t' || c == '\r') && c != delimiter; }

std::string_view trim(std::string_view s, char delimiter) {
  while (!s.empty() && is_blank(s.front(), delimiter)) s.remove_prefix(1);
  while (!s.empty() && is_blank(s.back(), delimiter)) s.remove_suffix(1);
  return s;
}

// A field as an error message shows it: quoted, control characters replaced, cut after 40 bytes.
std::string shown(std::string_view field) {
  if (field.empty()) return "an empty field";
  std::string out = "\"";
  for (char c : field.substr(0, 40)) out += (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) ? '?' : c;
  return out + (field.size() > 40 ? "...\"" : "\"");
}

// Parses the whole field as a number (std::from_chars: locale-independent, exact rounding).
// A leading '+' is accepted, as most CSV writers may produce one.
template <typename T>
std::errc parse_number(std::string_view field, T& out) {
  if (field.size() > 1 && field.front() == '+' && field[1] != '-' && field[1] != '+') field.remove_prefix(1);
  auto [end, error] = std::from_chars(field.data(), field.data() + field.size(), out);
  if (error == std::errc() && end != field.data() + field.size()) return std::errc::invalid_argument;
  return error;
}

// The position of one field, for error messages: "digits.csv:17, column 65".
struct Where {
  const std::string& source;
  int64_t line, column;
};

std::ostream& operator<<(std::ostream& out, const Where& at) {
  return out << at.source << ":" << at.line << ", column " << at.column;
}

float parse_value(std::string_view field, const Where& at, bool first_row_without_header) {
  float value = 0;
  std::errc error = parse_number(field, value);
  TINYDDP_CHECK(error != std::errc::result_out_of_range, at, ": the number ", shown(field),
                " does not fit in a 32-bit float", hint("rescale the column"));
  TINYDDP_CHECK(error == std::errc(), at, ": expected a number, found ", shown(field),
                hint(first_row_without_header ? "if this line holds column names, set CsvOptions::has_header"
                                              : "every field must be a number"));
  TINYDDP_CHECK(std::isfinite(value), at, ": expected a finite number, found ", shown(field),
                hint("fill in or drop the missing values before training"));
  return value;
}

// A feature times CsvOptions::feature_scale, which must stay finite (a large scale can overflow).
float scaled(float value, const Where& at, const CsvOptions& options) {
  const float result = value * options.feature_scale;
  TINYDDP_CHECK(std::isfinite(result), at, ": ", value, " times feature_scale ", options.feature_scale,
                " overflows a 32-bit float", hint("use a smaller feature_scale"));
  return result;
}

int64_t parse_class_label(std::string_view field, const Where& at, bool first_row_without_header, int64_t num_classes) {
  int64_t label = 0;
  if (parse_number(field, label) != std::errc()) {
    // Not written as an integer: accept a whole number written as a float ("3.0"), refuse the rest.
    double value = 0;
    TINYDDP_CHECK(parse_number(field, value) == std::errc(), at, ": expected a class label, found ", shown(field),
                  hint(first_row_without_header ? "if this line holds column names, set CsvOptions::has_header"
                                                : "class labels are whole numbers 0, 1, 2, ..."));
    TINYDDP_CHECK(std::isfinite(value) && value == std::floor(value) && std::fabs(value) < 9.0e15, at, ": the label ",
                  shown(field), " is not an integer",
                  hint("class labels are whole numbers 0, 1, 2, ...",
                       " (set CsvOptions::class_labels = false for real-valued targets)"));
    label = int64_t(value);
  }
  TINYDDP_CHECK(label >= 0, at, ": the label ", label, " is negative", hint("class labels count from 0"));
  TINYDDP_CHECK(num_classes == 0 || label < num_classes, at, ": the label ", label, " is not a class of this model (",
                num_classes, " classes: 0 to ", num_classes - 1, ")",
                hint("fix the line, or check that the label is", " the column CsvOptions::label_column names"));
  return label;
}

void check_options(const CsvOptions& options) {
  const char d = options.delimiter;
  TINYDDP_CHECK(!(d >= '0' && d <= '9') && std::strchr(".+-eE\n\r\"", d) == nullptr && d != '\0',
                "read_csv: the delimiter '", d, "' can be part of a number or a line break",
                hint("use ',', ';', '\\t' or ' '"));
  TINYDDP_CHECK(std::isfinite(options.feature_scale), "read_csv: feature_scale ", options.feature_scale,
                " is not finite", hint("pass for example 1.f / 16"));
  TINYDDP_CHECK(options.num_classes >= 0, "read_csv: num_classes is ", options.num_classes,
                hint("pass the model's number of classes, or 0 for no upper bound"));
  TINYDDP_CHECK(options.max_columns >= 2 && options.max_line_bytes > 0 && options.max_bytes > 0 && options.max_rows > 0,
                "read_csv: the size limits must be positive (max_columns at least 2)",
                hint("leave CsvOptions' limits at their defaults or raise them"));
}

}  // namespace

TensorDataset parse_csv(const std::string& text, const std::string& source, const CsvOptions& options) {
  check_options(options);
  TINYDDP_CHECK(text.size() <= options.max_bytes, source, " holds ", text.size(), " bytes of text, over the limit of ",
                options.max_bytes, hint("raise CsvOptions::max_bytes if the file is right"));
  std::vector<float> features, value_labels;
  std::vector<int64_t> class_labels;
  std::vector<std::string_view> fields;
  int64_t columns = 0, label_column = 0, first_line = 0, rows = 0, line_number = 0;
  bool header_pending = options.has_header;

  for (size_t position = 0; position < text.size();) {
    size_t newline = text.find('\n', position);
    if (newline == std::string::npos) newline = text.size();
    std::string_view line(text.data() + position, newline - position);
    position = newline + 1;
    ++line_number;
    TINYDDP_CHECK(line.size() <= options.max_line_bytes, source, ":", line_number, ": the line is ", line.size(),
                  " bytes long, over the limit of ", options.max_line_bytes,
                  hint("raise CsvOptions::max_line_bytes if the file is right"));
    if (trim(line, options.delimiter).empty()) continue;  // blank lines (a trailing newline, spacing) carry no row

    fields.clear();
    for (size_t begin = 0;;) {
      size_t end = line.find(options.delimiter, begin);
      fields.push_back(trim(line.substr(begin, end == std::string_view::npos ? std::string_view::npos : end - begin),
                            options.delimiter));
      TINYDDP_CHECK(int64_t(fields.size()) <= options.max_columns, source, ":", line_number, ": more than ",
                    options.max_columns, " columns", hint("check the delimiter, or raise CsvOptions::max_columns"));
      if (end == std::string_view::npos) break;
      begin = end + 1;
    }

    if (columns == 0) {  // the first non-blank line fixes the number of columns and the label's position
      columns = int64_t(fields.size());
      first_line = line_number;
      TINYDDP_CHECK(columns >= 2, source, ":", line_number, ": found a single column, but a row needs at least one",
                    " feature and a label", hint("check CsvOptions::delimiter (it is '", options.delimiter, "')"));
      label_column = options.label_column < 0 ? columns + options.label_column : options.label_column;
      TINYDDP_CHECK(label_column >= 0 && label_column < columns, source, ":", line_number, ": label_column ",
                    options.label_column, " is outside the ", columns, " columns of this row",
                    hint("use 0..columns-1, or -1 for the last column"));
    } else {
      TINYDDP_CHECK(int64_t(fields.size()) == columns, source, ":", line_number, ": found ", fields.size(),
                    " columns, but line ", first_line, " has ", columns,
                    hint("every row needs the same number of columns (a missing or extra delimiter?)"));
    }
    if (header_pending) {
      header_pending = false;
      continue;
    }

    TINYDDP_CHECK(rows < options.max_rows, source, ":", line_number, ": more than ", options.max_rows, " data rows",
                  hint("raise CsvOptions::max_rows if the file is right"));
    const bool first_row_without_header = !options.has_header && line_number == first_line;
    for (int64_t column = 0; column < columns; ++column) {
      const std::string_view field = fields[size_t(column)];
      const Where at{source, line_number, column + 1};
      if (column != label_column)
        features.push_back(scaled(parse_value(field, at, first_row_without_header), at, options));
      else if (options.class_labels)
        class_labels.push_back(parse_class_label(field, at, first_row_without_header, options.num_classes));
      else
        value_labels.push_back(parse_value(field, at, first_row_without_header));
    }
    ++rows;
  }

  TINYDDP_CHECK(rows > 0, source,
                text.empty()   ? " is empty"
                : columns == 0 ? " holds only blank lines"
                               : " holds a header but no data rows",
                hint("a CSV dataset needs at least one row of numbers"));
  Tensor inputs = Tensor::from_vector(features, {rows, columns - 1});
  Tensor targets = options.class_labels ? Tensor::from_vector(class_labels, {rows})
                                        : Tensor::from_vector(value_labels, {rows});
  return TensorDataset(std::move(inputs), std::move(targets));
}

TensorDataset read_csv(const std::string& path, const CsvOptions& options) {
  return parse_csv(read_text(path, options.max_bytes), path, options);
}

}  // namespace tinyddp::nn
