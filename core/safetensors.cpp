#include "core/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

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
               tensors.size() > 8 ? ", ..." : "", ")");
}

namespace {

uint64_t read_le64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// Writes all of `data` or throws, retrying short writes (a write() may write less than asked).
void write_all(int fd, const void* data, size_t size, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    TINYDDP_CHECK(n > 0, "writing ", path, " failed: ", std::strerror(errno), "; hint: check free disk space and permissions");
    p += n;
    size -= size_t(n);
  }
}

}  // namespace

SafetensorsFile parse_safetensors(const std::string& bytes, const std::string& source) {
  TINYDDP_CHECK(bytes.size() >= 8, source, " is not a safetensors file: it has ", bytes.size(),
                " bytes, fewer than the 8-byte header length; hint: the file is truncated or empty");
  uint64_t header_len = read_le64(reinterpret_cast<const unsigned char*>(bytes.data()));
  TINYDDP_CHECK(header_len <= kMaxSafetensorsHeader, source, ": header length ", header_len, " exceeds the ",
                kMaxSafetensorsHeader, "-byte limit; hint: the file is corrupt or not safetensors");
  TINYDDP_CHECK(header_len <= bytes.size() - 8, source, ": header claims ", header_len, " bytes but only ",
                bytes.size() - 8, " follow; hint: the file is truncated");
  json header;
  try {
    header = json::parse(bytes.begin() + 8, bytes.begin() + 8 + std::ptrdiff_t(header_len));
  } catch (const json::exception& e) {
    TINYDDP_FAIL(source, ": the header is not valid JSON (", e.what(), "); hint: the file is corrupt");
  }
  TINYDDP_CHECK(header.is_object(), source, ": the header must be a JSON object");

  const uint64_t data_size = bytes.size() - 8 - header_len;
  const char* data = bytes.data() + 8 + header_len;
  SafetensorsFile file;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;  // to check for overlaps
  struct Entry {
    std::string name;
    DType dtype;
    Shape shape;
    uint64_t begin, end;
  };
  std::vector<Entry> entries;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& info = it.value();
    if (name == "__metadata__") {
      TINYDDP_CHECK(info.is_object(), source, ": __metadata__ must be an object of strings");
      for (auto m = info.begin(); m != info.end(); ++m) {
        TINYDDP_CHECK(m.value().is_string(), source, ": __metadata__ value \"", m.key(), "\" is not a string");
        file.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = source + ", tensor \"" + name + "\"";
    TINYDDP_CHECK(info.is_object() && info.contains("dtype") && info.contains("shape") && info.contains("data_offsets"),
                  where, ": needs dtype, shape and data_offsets");
    TINYDDP_CHECK(info["dtype"].is_string(), where, ": dtype is not a string");
    Entry e{name, dtype_from_safetensors_name(info["dtype"].get<std::string>()), {}, 0, 0};
    TINYDDP_CHECK(info["shape"].is_array() && info["shape"].size() <= 8, where, ": shape must be an array of at most 8 sizes");
    uint64_t numel = 1;
    for (const json& d : info["shape"]) {
      TINYDDP_CHECK(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0), where,
                    ": shape entries must be non-negative integers");
      uint64_t size = d.get<uint64_t>();
      TINYDDP_CHECK(size <= data_size && (size == 0 || numel <= data_size / size + 1), where, ": shape is larger than the file");
      numel *= size;
      e.shape.push_back(int64_t(size));
    }
    const json& offsets = info["data_offsets"];
    TINYDDP_CHECK(offsets.is_array() && offsets.size() == 2 && offsets[0].is_number_unsigned() && offsets[1].is_number_unsigned(),
                  where, ": data_offsets must be [begin, end]");
    e.begin = offsets[0].get<uint64_t>();
    e.end = offsets[1].get<uint64_t>();
    TINYDDP_CHECK(e.begin <= e.end && e.end <= data_size, where, ": data_offsets [", e.begin, ", ", e.end,
                  "] fall outside the ", data_size, " data bytes; hint: the file is truncated or corrupt");
    TINYDDP_CHECK(e.end - e.begin == numel * dtype_size(e.dtype), where, ": holds ", e.end - e.begin, " bytes but ",
                  dtype_name(e.dtype), shape_str(e.shape), " needs ", numel * dtype_size(e.dtype));
    entries.push_back(std::move(e));
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < entries.size(); ++i)
    TINYDDP_CHECK(entries[i].begin >= entries[i - 1].end || entries[i - 1].begin == entries[i - 1].end, source,
                  ": tensors \"", entries[i - 1].name, "\" and \"", entries[i].name, "\" overlap; hint: the file is corrupt");
  for (const Entry& e : entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype);
    if (t.nbytes()) std::memcpy(t.raw_data(), data + e.begin, t.nbytes());
    file.tensors.emplace_back(e.name, std::move(t));
  }
  return file;
}

SafetensorsFile load_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TINYDDP_CHECK(in.good(), "cannot open ", path, ": ", std::strerror(errno), "; hint: check the path");
  in.seekg(0, std::ios::end);
  std::streamoff size = in.tellg();
  in.seekg(0);
  std::string bytes(size_t(size > 0 ? size : 0), '\0');
  in.read(bytes.data(), std::streamsize(bytes.size()));
  TINYDDP_CHECK(in.good() || bytes.empty(), "reading ", path, " failed");
  return parse_safetensors(bytes, path);
}

void save_safetensors(const std::string& path, const NamedTensors& tensors, const Metadata& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  std::vector<Tensor> host;
  for (const auto& [name, tensor] : tensors) {
    TINYDDP_CHECK(name != "__metadata__" && !name.empty(), "save_safetensors: invalid tensor name \"", name, "\"");
    TINYDDP_CHECK(!header.contains(name), "save_safetensors: the name \"", name, "\" appears twice");
    host.push_back(tensor.to(Device::cpu()));
    header[name] = {{"dtype", dtype_safetensors_name(tensor.dtype())},
                    {"shape", tensor.shape()},
                    {"data_offsets", {offset, offset + tensor.nbytes()}}};
    offset += tensor.nbytes();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // pad so the data starts 8-byte aligned, as the spec suggests
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(uint64_t(text.size()) >> (8 * i));

  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  TINYDDP_CHECK(fd >= 0, "cannot create ", tmp, ": ", std::strerror(errno), "; hint: check that the directory exists and is writable");
  try {
    write_all(fd, len, 8, tmp);
    write_all(fd, text.data(), text.size(), tmp);
    for (const Tensor& t : host) write_all(fd, t.raw_data(), t.nbytes(), tmp);
    TINYDDP_CHECK(::fsync(fd) == 0, "fsync of ", tmp, " failed: ", std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    TINYDDP_FAIL("cannot move ", tmp, " to ", path, ": ", std::strerror(err));
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
