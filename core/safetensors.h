// Reading and writing the safetensors format, so PyTorch and the Hugging Face tools open our files
// and we open theirs.
//
// Layout of a file:
//   8 bytes   N, the header length, unsigned little-endian
//   N bytes   a JSON object: { "name": {"dtype": "F32", "shape": [2, 10], "data_offsets": [begin, end]},
//                              ..., "__metadata__": {"key": "string value", ...} }
//             (a writer may pad it with trailing spaces so the data starts 8-byte aligned)
//   the rest  the tensors' raw little-endian bytes; offsets count from the end of the header
//
// Loading trusts nothing, because a checkpoint may be truncated by a crash, damaged on disk or made
// by someone else: the header must be valid JSON of bounded size and nesting, with no name twice;
// every dtype must be known, every shape a list of non-negative integers whose byte count (checked
// for overflow) equals end - begin; and the tensors must tile the data region exactly, as the
// reference implementation requires: sorted by offset, each begins where the previous one ended (no
// overlap, no gap) and the last ends at the end of the file. Any fault is an error naming the file,
// the tensor and what was found, and nothing is returned.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tinyddp/core/tensor.h"

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

// Headers beyond this are refused before anything is allocated (the reference implementation's own
// limit is 100 MB).
constexpr size_t kMaxSafetensorsHeader = 100u << 20;
// A tensor may have at most this many dimensions (PyTorch's own limit is 64).
constexpr size_t kMaxSafetensorsRank = 64;

// Writes CPU (or any device's, copied to the CPU) tensors atomically: to a temporary file next to
// `path` ("<path>.tmp.<pid>.<n>"), fsync, then rename over `path`, then fsync the directory. A crash
// at any moment leaves either the previous file or the new one, never a mixture; at worst a stray
// temporary file remains, which later saves and loads ignore.
void save_safetensors(const std::string& path, const NamedTensors& tensors, const Metadata& metadata = {});
// Reads and validates a whole file into CPU tensors. The header is validated before any tensor
// memory is allocated, and the data is read straight into the tensors (no second copy of the file).
SafetensorsFile load_safetensors(const std::string& path);
// Parses an in-memory image of a file (the fuzz target calls this). `source_name` names the bytes in
// error messages.
SafetensorsFile parse_safetensors(const std::string& bytes, const std::string& source_name);

}  // namespace tinyddp
