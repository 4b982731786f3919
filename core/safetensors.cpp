#include "tinyddp/core/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "tinyddp/core/remove_on_stop_signal.h"

namespace tinyddp {

using json = nlohmann::json;

bool SafetensorsFile::has(const std::string& name) const {
  return std::any_of(tensors.begin(), tensors.end(), [&](const auto& entry) { return entry.first == name; });
}

const Tensor& SafetensorsFile::get(const std::string& name) const {
  for (const auto& [key, tensor] : tensors)
    if (key == name) return tensor;
  std::string some;
  for (size_t i = 0; i < tensors.size() && i < 8; ++i) some += (i ? ", " : "") + tensors[i].first;
  TINYDDP_FAIL("no tensor named \"", name, "\" in this safetensors file; it holds ", tensors.size(), " tensors (", some,
               tensors.size() > 8 ? ", ..." : "", ")", hint("check the name (PyTorch names parameters \"0.weight\")"));
}

namespace {

// Where one tensor's bytes lie in the data region, as the header says.
struct TensorEntry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;  // offsets into the data region (after the header)
};

struct Header {
  std::vector<TensorEntry> entries;  // sorted by data offset
  Metadata metadata;
};

constexpr DType kAllDTypes[] = {DType::f32, DType::f64, DType::i32, DType::i64, DType::u8, DType::bf16, DType::f16};

uint64_t read_le64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// The first check of any file: it must at least hold the 8-byte length prefix.
void check_has_length_prefix(uint64_t file_size, const std::string& source) {
  TINYDDP_CHECK(file_size > 0, source, " is empty (0 bytes), not a safetensors file",
                hint("it was truncated or never finished writing; save it again"));
  TINYDDP_CHECK(file_size >= 8, source, " is not a safetensors file: it has ", file_size,
                " bytes, fewer than the 8-byte header length", hint("the file is truncated"));
}

// Reads the length prefix and checks it against the limit and the file size.
uint64_t checked_header_length(const unsigned char* prefix, uint64_t file_size, const std::string& source) {
  const uint64_t header_len = read_le64(prefix);
  TINYDDP_CHECK(header_len <= kMaxSafetensorsHeader, source, ": header length ", header_len, " exceeds the ",
                kMaxSafetensorsHeader, "-byte limit", hint("the file is corrupt or not a safetensors file"));
  TINYDDP_CHECK(header_len <= file_size - 8, source, ": the header claims ", header_len, " bytes but only ",
                file_size - 8, " follow the length prefix", hint("the file is truncated"));
  TINYDDP_CHECK(header_len >= 2, source, ": the header is ", header_len, " bytes long, too short for a JSON object",
                hint("the file is corrupt"));
  return header_len;
}

// Parses the header text. The structure we accept is three levels deep ({name: {shape: [sizes]}}),
// so deeper nesting is refused while parsing: a hostile header cannot make us build a deep tree.
// The same callback refuses a tensor name given twice (JSON parsers would silently keep the last).
json parse_header_json(const char* text, size_t size, const std::string& source) {
  constexpr int kMaxDepth = 3;
  std::set<std::string> names;
  auto check = [&](int depth, json::parse_event_t event, json& parsed) {
    TINYDDP_CHECK(depth <= kMaxDepth, source, ": the header nests deeper than a safetensors header can",
                  hint("the file is corrupt or not a safetensors file"));
    if (depth == 1 && event == json::parse_event_t::key) {
      const std::string& name = parsed.get_ref<const std::string&>();
      TINYDDP_CHECK(names.insert(name).second, source, ": the header names \"", name, "\" twice",
                    hint("the file is corrupt or its writer is broken"));
    }
    return true;
  };
  try {
    return json::parse(text, text + size, check);
  } catch (const json::exception& e) {
    TINYDDP_FAIL(source, ": the header is not valid JSON (", e.what(), ")", hint("the file is corrupt or truncated"));
  }
}

DType parse_dtype(const json& dtype, const std::string& where) {
  TINYDDP_CHECK(dtype.is_string(), where, ": \"dtype\" is ", dtype.type_name(), ", expected a string such as \"F32\"",
                hint("the file is corrupt"));
  const std::string& name = dtype.get_ref<const std::string&>();
  for (DType t : kAllDTypes)
    if (name == dtype_safetensors_name(t)) return t;
  TINYDDP_FAIL(where, ": unsupported dtype \"", name, "\"",
               hint("tinyddp reads F32, F64, BF16, F16, I32, I64 and U8: ",
                    "convert the tensor before saving it (in PyTorch: tensor.float())"));
}

// A non-negative integer that fits in int64, or an error naming `what`.
uint64_t parse_size(const json& value, const std::string& where, const char* what) {
  TINYDDP_CHECK(value.is_number_unsigned() || (value.is_number_integer() && value.get<int64_t>() >= 0), where, ": ",
                what, " must be non-negative integers, found ", value.dump(), hint("the file is corrupt"));
  uint64_t v = value.get<uint64_t>();
  TINYDDP_CHECK(v <= uint64_t(std::numeric_limits<int64_t>::max()), where, ": ", what, " value ", v, " is too large",
                hint("the file is corrupt"));
  return v;
}

TensorEntry parse_entry(const std::string& name, const json& info, uint64_t data_size, const std::string& source) {
  const std::string where = source + ", tensor \"" + name + "\"";
  TINYDDP_CHECK(info.is_object(), where, ": the entry is ", info.type_name(),
                ", expected an object with dtype, shape and data_offsets", hint("the file is corrupt"));
  for (const char* field : {"dtype", "shape", "data_offsets"})
    TINYDDP_CHECK(info.contains(field), where, ": the entry has no \"", field, "\"", hint("the file is corrupt"));

  TensorEntry e{name, parse_dtype(info.at("dtype"), where), {}, 0, 0};

  const json& shape = info.at("shape");
  TINYDDP_CHECK(shape.is_array() && shape.size() <= kMaxSafetensorsRank, where,
                ": \"shape\" must be an array of at most ", kMaxSafetensorsRank, " sizes, found ",
                shape.is_array() ? "a longer array" : shape.type_name(), hint("the file is corrupt"));
  uint64_t numel = 1;
  for (const json& d : shape) {
    uint64_t size = parse_size(d, where, "shape entries");
    e.shape.push_back(int64_t(size));
    TINYDDP_CHECK(!__builtin_mul_overflow(numel, size, &numel), where, ": shape ", shape.dump(),
                  " has more elements than fit in 64 bits", hint("the file is corrupt"));
  }
  uint64_t nbytes = 0;
  TINYDDP_CHECK(!__builtin_mul_overflow(numel, uint64_t(dtype_size(e.dtype)), &nbytes), where, ": shape ", shape.dump(),
                " needs more bytes than fit in 64 bits", hint("the file is corrupt"));

  const json& offsets = info.at("data_offsets");
  TINYDDP_CHECK(offsets.is_array() && offsets.size() == 2, where, ": \"data_offsets\" must be [begin, end], found ",
                offsets.dump(), hint("the file is corrupt"));
  e.begin = parse_size(offsets[0], where, "data_offsets");
  e.end = parse_size(offsets[1], where, "data_offsets");
  TINYDDP_CHECK(e.begin <= e.end && e.end <= data_size, where, ": data_offsets [", e.begin, ", ", e.end,
                "] fall outside the ", data_size, " data bytes", hint("the file is truncated or corrupt"));
  TINYDDP_CHECK(e.end - e.begin == nbytes, where, ": data_offsets hold ", e.end - e.begin, " bytes but ",
                dtype_name(e.dtype), shape_str(e.shape), " needs ", nbytes, hint("the file is corrupt"));
  return e;
}

Metadata parse_metadata(const json& info, const std::string& source) {
  TINYDDP_CHECK(info.is_object(), source, ": __metadata__ is ", info.type_name(), ", expected an object of strings",
                hint("the file is corrupt"));
  Metadata metadata;
  for (auto m = info.begin(); m != info.end(); ++m) {
    TINYDDP_CHECK(m.value().is_string(), source, ": __metadata__ value \"", m.key(), "\" is not a string but ",
                  m.value().type_name(), " (", m.value().dump(), ")",
                  hint("safetensors metadata maps strings to strings"));
    metadata[m.key()] = m.value().get<std::string>();
  }
  return metadata;
}

// Sorted by offset, each tensor must begin where the previous one ended and the last must end at the
// end of the file: no byte belongs to two tensors, and none to no tensor.
void check_tiling(const std::vector<TensorEntry>& entries, uint64_t data_size, const std::string& source) {
  uint64_t covered = 0;               // data bytes [0, covered) belong to the tensors seen so far
  const TensorEntry* last = nullptr;  // the tensor that ends at `covered`
  for (const TensorEntry& e : entries) {
    if (e.begin < covered)  // then covered > 0, so `last` is set
      TINYDDP_FAIL(source, ": tensor \"", e.name, "\" (data bytes [", e.begin, ", ", e.end, ")) overlaps tensor \"",
                   last->name, "\" (bytes [", last->begin, ", ", last->end, "))", hint("the file is corrupt"));
    TINYDDP_CHECK(e.begin == covered, source, ": data bytes [", covered, ", ", e.begin, ") before tensor \"", e.name,
                  "\" belong to no tensor", hint("the file is corrupt"));
    if (e.end > e.begin) {
      covered = e.end;
      last = &e;
    }
  }
  TINYDDP_CHECK(covered == data_size, source, ": the last ", data_size - covered, " data bytes belong to no tensor",
                hint("the file is corrupt, or it was appended to"));
}

// Validates the whole header against a data region of `data_size` bytes.
Header parse_header(const char* text, size_t size, uint64_t data_size, const std::string& source) {
  json header = parse_header_json(text, size, source);
  TINYDDP_CHECK(header.is_object(), source, ": the header must be a JSON object, found ", header.type_name(),
                hint("the file is corrupt or not a safetensors file"));
  Header result;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__")
      result.metadata = parse_metadata(it.value(), source);
    else
      result.entries.push_back(parse_entry(it.key(), it.value(), data_size, source));
  }
  std::sort(result.entries.begin(), result.entries.end(), [](const TensorEntry& a, const TensorEntry& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  check_tiling(result.entries, data_size, source);
  return result;
}

// Allocates the tensors of a validated header and lets `fill(entry, destination)` bring their bytes.
template <typename Fill>
SafetensorsFile materialize(Header&& header, Fill&& fill) {
  SafetensorsFile file;
  file.metadata = std::move(header.metadata);
  file.tensors.reserve(header.entries.size());
  for (const TensorEntry& e : header.entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype);
    if (t.nbytes()) fill(e, t.raw_data());
    file.tensors.emplace_back(e.name, std::move(t));
  }
  return file;
}

// Closes a file descriptor when the scope ends, whichever way it ends.
struct FdCloser {
  int fd;
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
};

// Reads exactly `size` bytes at `offset`, retrying short reads; a file that ends early is an error.
void read_exact(int fd, void* out, size_t size, uint64_t offset, const std::string& path) {
  char* p = static_cast<char*>(out);
  while (size > 0) {
    ssize_t n = ::pread(fd, p, size, off_t(offset));
    if (n < 0 && errno == EINTR) continue;
    TINYDDP_CHECK(n >= 0, "reading ", path, " failed: ", std::strerror(errno), hint("check the disk and the file"));
    TINYDDP_CHECK(n > 0, "reading ", path, ": the file ended early at byte ", offset,
                  hint("another process truncated it while it was being read"));
    p += n;
    size -= size_t(n);
    offset += uint64_t(n);
  }
}

// Writes all of `data` or throws, retrying short writes (a write() may write less than asked).
void write_all(int fd, const void* data, size_t size, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    TINYDDP_CHECK(n > 0, "writing ", path, " failed: ", std::strerror(errno),
                  hint("check free disk space and permissions"));
    p += n;
    size -= size_t(n);
  }
}

// A temporary name next to `path`, unique across processes (pid) and threads (counter), so two
// concurrent saves never write into one temporary file.
std::string temporary_path(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  return path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
}

// Builds the header text for `tensors` laid out back to back in the given order.
std::string header_text(const NamedTensors& tensors, const Metadata& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    TINYDDP_CHECK(!name.empty() && name != "__metadata__", "save_safetensors: invalid tensor name \"", name, "\"",
                  hint("names must be non-empty and not \"__metadata__\""));
    TINYDDP_CHECK(names.insert(name).second, "save_safetensors: the name \"", name, "\" appears twice",
                  hint("every tensor needs its own name"));
    TINYDDP_CHECK(tensor.defined(), "save_safetensors: tensor \"", name, "\" is undefined",
                  hint("create it before saving"));
    header[name] = {{"dtype", dtype_safetensors_name(tensor.dtype())},
                    {"shape", tensor.shape()},
                    {"data_offsets", {offset, offset + tensor.nbytes()}}};
    offset += tensor.nbytes();
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const json::exception& e) {
    TINYDDP_FAIL("save_safetensors: a tensor name or metadata string is not valid UTF-8 (", e.what(), ")",
                 hint("use UTF-8 text for names and metadata"));
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // pad so the data starts 8-byte aligned, as the spec suggests
  TINYDDP_CHECK(text.size() <= kMaxSafetensorsHeader, "save_safetensors: the header would be ", text.size(),
                " bytes, over the ", kMaxSafetensorsHeader, "-byte limit readers enforce", hint("store less metadata"));
  return text;
}

}  // namespace

SafetensorsFile parse_safetensors(const std::string& bytes, const std::string& source) {
  check_has_length_prefix(bytes.size(), source);
  const uint64_t header_len = checked_header_length(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(),
                                                    source);
  const uint64_t data_size = bytes.size() - 8 - header_len;
  const char* data = bytes.data() + 8 + header_len;
  return materialize(parse_header(bytes.data() + 8, header_len, data_size, source),
                     [&](const TensorEntry& e, void* out) { std::memcpy(out, data + e.begin, e.end - e.begin); });
}

SafetensorsFile load_safetensors(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TINYDDP_CHECK(fd >= 0, "cannot open ", path, ": ", std::strerror(errno), hint("check the path and its permissions"));
  FdCloser closer{fd};
  struct stat info {};
  TINYDDP_CHECK(::fstat(fd, &info) == 0, "cannot stat ", path, ": ", std::strerror(errno), hint("check the file"));
  TINYDDP_CHECK(S_ISREG(info.st_mode), path, " is not a regular file", hint("pass the path of a .safetensors file"));
  const uint64_t file_size = uint64_t(info.st_size);

  check_has_length_prefix(file_size, path);
  unsigned char prefix[8];
  read_exact(fd, prefix, 8, 0, path);
  const uint64_t header_len = checked_header_length(prefix, file_size, path);
  std::string text(header_len, '\0');
  read_exact(fd, text.data(), text.size(), 8, path);
  // Everything is validated against the file size before the (possibly large) tensors are allocated.
  const uint64_t data_start = 8 + header_len;
  return materialize(parse_header(text.data(), text.size(), file_size - data_start, path),
                     [&](const TensorEntry& e, void* out) {
                       read_exact(fd, out, e.end - e.begin, data_start + e.begin, path);
                     });
}

void save_safetensors(const std::string& path, const NamedTensors& tensors, const Metadata& metadata) {
  const std::string text = header_text(tensors, metadata);
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(uint64_t(text.size()) >> (8 * i));

  const std::string tmp = temporary_path(path);
  const RemoveOnStopSignal removed_if_stopped(tmp);  // Ctrl-C or SIGTERM mid-write leaves no temporary behind
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  TINYDDP_CHECK(fd >= 0, "cannot create ", tmp, ": ", std::strerror(errno),
                hint("check that the directory exists and is writable"));
  try {
    write_all(fd, len, 8, tmp);
    write_all(fd, text.data(), text.size(), tmp);
    for (const auto& [name, tensor] : tensors) {
      Tensor host = tensor.to(Device::cpu());  // one tensor at a time: a GPU model is never copied whole
      write_all(fd, host.raw_data(), host.nbytes(), tmp);
    }
    // The data must be on disk before the rename makes it visible under `path`; otherwise a power
    // cut could leave the new name pointing at a file whose blocks were never written.
    TINYDDP_CHECK(::fsync(fd) == 0, "fsync of ", tmp, " failed: ", std::strerror(errno), hint("check the disk"));
    int closed = ::close(fd);
    fd = -1;
    TINYDDP_CHECK(closed == 0, "closing ", tmp, " failed: ", std::strerror(errno), hint("check the disk"));
  } catch (...) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  // rename() replaces `path` atomically: a reader sees the old file or the new one, never a mixture.
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    TINYDDP_FAIL("cannot move ", tmp, " to ", path, ": ", std::strerror(err),
                 hint("check that ", path, " is not a directory and its folder is writable"));
  }
  // Make the rename itself durable: fsync the directory that holds the file.
  std::string dir = path.find('/') == std::string::npos ? "." : path.substr(0, path.rfind('/') + 1);
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace tinyddp
