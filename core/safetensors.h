// Reading and writing the safetensors format, so PyTorch and the Hugging Face tools open our files
// and we open theirs.
//
// Layout of a file:
//   8 bytes   N, the header length, unsigned little-endian
//   N bytes   a JSON object: { "name": {"dtype": "F32", "shape": [2, 10], "data_offsets": [begin, end]},
//                              ..., "__metadata__": {"key": "string value", ...} }
//   the rest  the tensors' raw little-endian bytes; offsets count from the end of the header
//
// Loading trusts nothing: every offset must lie inside the file, byte counts must match dtype x
// shape, tensors must not overlap, and the header must be valid JSON of bounded size. Any fault is an
// error naming the file and the entry, and nothing is returned.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace tinyddp {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
using Metadata = std::map<std::string, std::string>;

struct SafetensorsFile {
  NamedTensors tensors;  // in file order (by data offset)
  Metadata metadata;

  bool has(const std::string& name) const;
  // The tensor called `name`; throws an error listing a few names that do exist.
  const Tensor& get(const std::string& name) const;
};

// Headers beyond this are refused before anything is allocated (the spec's own limit is 100 MB).
constexpr size_t kMaxSafetensorsHeader = 100u << 20;

// Writes CPU (or any device's, copied to the CPU) tensors atomically: to "<path>.tmp.<pid>", fsync,
// then rename over `path`, so a crash mid-write leaves the previous file intact.
void save_safetensors(const std::string& path, const NamedTensors& tensors, const Metadata& metadata = {});
// Reads and validates a whole file into CPU tensors.
SafetensorsFile load_safetensors(const std::string& path);
// Parses an in-memory image of a file (used by load_safetensors and by the fuzz target).
SafetensorsFile parse_safetensors(const std::string& bytes, const std::string& source_name);

}  // namespace tinyddp
