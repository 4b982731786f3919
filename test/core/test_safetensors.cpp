// The safetensors reader and writer: round trips, files from an independent Python writer, our files
// read by an independent reader, every malformed-file case, and seeded mutations through the fuzz entry.
#include <doctest/doctest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tinyddp/core/random.h"
#include "tinyddp/core/safetensors.h"
#include "test/test_support.h"
// The libFuzzer entry point itself, so the mutation test below runs exactly what the fuzzer runs.
#include "test/fuzz/fuzz_safetensors.cpp"

using namespace tinyddp;
using json = nlohmann::json;

namespace {

// A fresh folder under the system's temporary directory, removed with everything in it at the end.
using tinyddp::testing::TempDir;

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

// A file image: the 8-byte little-endian length of `header`, the header, then `data`.
std::string file_image(const std::string& header, const std::string& data = "") {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[size_t(i)] = char(uint64_t(header.size()) >> (8 * i));
  return out + header + data;
}

std::string with_length_prefix(uint64_t length, const std::string& rest) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[size_t(i)] = char(length >> (8 * i));
  return out + rest;
}

// Requires parse_safetensors to refuse `bytes` with an error that names the file, says `problem`,
// and gives a hint.
void check_refused(const std::string& bytes, const std::string& problem) {
  try {
    parse_safetensors(bytes, "bad.safetensors");
    FAIL_CHECK("a file that should fail with \"" << problem << "\" was accepted");
  } catch (const Error& e) {
    const std::string message = e.what();
    CHECK_MESSAGE(message.find(problem) != std::string::npos,
                  "the error \"" << message << "\" does not say \"" << problem << "\"");
    CHECK_MESSAGE(message.find("bad.safetensors") != std::string::npos,
                  "the error \"" << message << "\" does not name the file");
    CHECK_MESSAGE(!e.hint().empty(), "the error \"" << message << "\" gives no hint");
  }
}

// One valid tensor entry: an f32 [n] tensor at [begin, begin + 4n).
std::string f32_entry(const std::string& name, int n, int begin) {
  return "\"" + name + "\":{\"dtype\":\"F32\",\"shape\":[" + std::to_string(n) + "],\"data_offsets\":[" +
         std::to_string(begin) + "," + std::to_string(begin + 4 * n) + "]}";
}

// A JSON object from its members: json_object({f32_entry(...), "\"k\":..."}) -> "{member,member}".
std::string json_object(const std::vector<std::string>& members) {
  std::string text = "{";
  for (size_t i = 0; i < members.size(); ++i) text += (i ? "," : "") + members[i];
  return text + "}";
}

NamedTensors every_dtype() {
  return {{"f32", Tensor::from_vector<float>({1.5f, -2.f, 0.f, 3.25f, -0.f, 1e-30f}, {2, 3})},
          {"f64", Tensor::from_vector<double>({1.0 / 3.0, -1e300})},
          {"i32", Tensor::from_vector<int32_t>({std::numeric_limits<int32_t>::min(), 0, 7}, {3, 1})},
          {"i64", Tensor::from_vector<int64_t>({std::numeric_limits<int64_t>::max(), -1})},
          {"u8", Tensor::from_vector<uint8_t>({0, 255, 17})},
          {"empty", Tensor::zeros({0, 5})},
          {"empty_i64", Tensor::zeros({3, 0}, DType::i64)},
          {"scalar", Tensor::from_vector<double>({2.5}, {})}};
}

}  // namespace

TEST_CASE("save then load gives back every dtype, empty and 0-d tensors, and metadata, in order") {
  TempDir dir;
  const NamedTensors tensors = every_dtype();
  const Metadata metadata{{"format", "pt"},
                          {"epoch", "3"},
                          {"note", "unicode: \xc3\xa9t\xc3\xa9 \xe2\x9c\x93"},
                          {"empty", ""}};
  save_safetensors(dir.file("all.safetensors"), tensors, metadata);
  SafetensorsFile loaded = load_safetensors(dir.file("all.safetensors"));
  REQUIRE(loaded.tensors.size() == tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    INFO("tensor ", tensors[i].first);
    CHECK(loaded.tensors[i].first == tensors[i].first);  // the file order is the order they were given in
    CHECK(bitwise_equal(loaded.tensors[i].second, tensors[i].second));
    CHECK(loaded.tensors[i].second.device().is_cpu());
  }
  CHECK(loaded.metadata == metadata);
  CHECK(loaded.has("u8"));
  CHECK_FALSE(loaded.has("nope"));
  CHECK_THROWS_WITH_AS(loaded.get("nope"), doctest::Contains("no tensor named \"nope\""), Error);
  // The in-memory parser reads the same bytes the same way.
  SafetensorsFile parsed = parse_safetensors(read_bytes(dir.file("all.safetensors")), "all");
  REQUIRE(parsed.tensors.size() == tensors.size());
  CHECK(bitwise_equal(parsed.get("f64"), tensors[1].second));
}

TEST_CASE("a file with no tensors, and one with metadata only, round trip") {
  TempDir dir;
  save_safetensors(dir.file("none.safetensors"), {});
  CHECK(load_safetensors(dir.file("none.safetensors")).tensors.empty());
  save_safetensors(dir.file("meta.safetensors"), {}, {{"k", "v"}});
  SafetensorsFile meta = load_safetensors(dir.file("meta.safetensors"));
  CHECK(meta.tensors.empty());
  CHECK(meta.metadata.at("k") == "v");
}

TEST_CASE("a file written by an independent Python writer is read exactly") {
  // test/fixtures/make_data.py writes it with struct + json, its data in an order unlike its header's
  // and without padding; the values below are the ones that script spells out.
  SafetensorsFile file = load_safetensors(testing::fixture("data_dtypes.safetensors"));
  std::vector<std::string> order;
  for (const auto& entry : file.tensors) order.push_back(entry.first);
  CHECK(order == std::vector<std::string>{"u8", "scalar", "i64", "empty", "f64", "i32", "f32"});  // by data offset

  const Tensor& f32 = file.get("f32");
  CHECK(f32.shape() == Shape{2, 3});
  std::vector<float> f = f32.to_vector<float>();
  CHECK(f[0] == -1.5f);
  CHECK(f[1] == 0.f);
  CHECK(f[2] == 2.25f);
  CHECK(f[3] == 1e-7f);  // Python's struct rounds 1e-7 to the nearest float, as the C++ literal does
  CHECK(f[4] == 3.0e38f);
  CHECK((f[5] == 0.f && std::signbit(f[5])));
  CHECK(file.get("f64").to_vector<double>() == std::vector<double>{1.0 / 3.0, -2.5, 1e300});
  CHECK(file.get("i32").shape() == Shape{2, 2});
  CHECK(file.get("i32").to_vector<int32_t>() ==
        std::vector<int32_t>{std::numeric_limits<int32_t>::min(), -1, 0, std::numeric_limits<int32_t>::max()});
  CHECK(file.get("i64").to_vector<int64_t>() ==
        std::vector<int64_t>{std::numeric_limits<int64_t>::min(), 42, std::numeric_limits<int64_t>::max()});
  CHECK(file.get("u8").to_vector<uint8_t>() == std::vector<uint8_t>{0, 1, 128, 255});
  CHECK(file.get("empty").shape() == Shape{0, 4});
  CHECK(file.get("empty").dtype() == DType::f32);
  CHECK(file.get("scalar").shape() == Shape{});
  CHECK(file.get("scalar").item<int64_t>() == 7);
  CHECK(file.metadata == Metadata{{"format", "pt"},
                                  {"note",
                                   "\xc3\xa9"
                                   "crit par make_data.py"}});
}

TEST_CASE("our file is what an independent reader expects") {
  // Decodes the file by hand: the length prefix, the JSON header with nlohmann, the raw bytes.
  TempDir dir;
  const NamedTensors tensors = every_dtype();
  save_safetensors(dir.file("ours.safetensors"), tensors, {{"format", "pt"}});
  const std::string bytes = read_bytes(dir.file("ours.safetensors"));
  REQUIRE(bytes.size() >= 8);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<unsigned char>(bytes[size_t(i)]);
  CHECK((8 + header_len) % 8 == 0);  // the data starts 8-byte aligned
  const json header = json::parse(bytes.substr(8, header_len));
  CHECK(header.at("__metadata__") == json{{"format", "pt"}});
  CHECK(header.size() == tensors.size() + 1);
  const std::string data = bytes.substr(8 + header_len);
  uint64_t expected_begin = 0;
  for (const auto& [name, tensor] : tensors) {
    INFO("tensor ", name);
    const json& entry = header.at(name);
    CHECK(entry.at("dtype") == dtype_safetensors_name(tensor.dtype()));
    CHECK(entry.at("shape").get<std::vector<int64_t>>() == tensor.shape());
    const uint64_t begin = entry.at("data_offsets")[0], end = entry.at("data_offsets")[1];
    CHECK(begin == expected_begin);  // back to back, in the order given
    CHECK(end - begin == tensor.nbytes());
    expected_begin = end;
    REQUIRE(end <= data.size());
    if (tensor.nbytes() > 0) CHECK(std::memcmp(data.data() + begin, tensor.raw_data(), tensor.nbytes()) == 0);
  }
  CHECK(expected_begin == data.size());
  // Spot-check the encoding itself: the f32 1.5 is 0x3fc00000, little-endian.
  const uint64_t f32_begin = header.at("f32").at("data_offsets")[0];
  CHECK(data.substr(f32_begin, 4) == std::string("\x00\x00\xc0\x3f", 4));
}

TEST_CASE("files too short for a header, or whose length prefix lies, are refused") {
  check_refused("", "is empty");
  check_refused(std::string(7, '\0'), "has 7 bytes, fewer than the 8-byte header length");
  check_refused(with_length_prefix(100, "{}"), "the header claims 100 bytes but only 2 follow");
  check_refused(with_length_prefix(kMaxSafetensorsHeader + 1, "{}"), "exceeds the");
  check_refused(with_length_prefix(~uint64_t(0), "{}"), "exceeds the");
  check_refused(with_length_prefix(0, ""), "too short for a JSON object");
}

TEST_CASE("headers that are not a JSON object of entries are refused") {
  check_refused(file_image("{\"a\": "), "not valid JSON");
  check_refused(file_image("{\"a\":1,}"), "not valid JSON");
  check_refused(file_image("\xff\xfe{}"), "not valid JSON");
  check_refused(file_image("[1, 2]"), "must be a JSON object, found array");
  check_refused(file_image("\"text\""), "must be a JSON object, found string");
  check_refused(file_image("{\"a\": 3}"), "the entry is number");
  check_refused(file_image(json_object({f32_entry("a", 1, 0), f32_entry("a", 1, 4)}), std::string(8, '\0')),
                "names \"a\" twice");
  // Nesting deeper than a safetensors header can is refused while parsing (no deep tree is built).
  check_refused(file_image("{\"a\":{\"dtype\":\"F32\",\"shape\":[[[1]]],\"data_offsets\":[0,4]}}",
                           std::string(4, '\0')),
                "nests deeper");
  check_refused(file_image(std::string(100000, '[') + std::string(100000, ']')), "nests deeper");
}

TEST_CASE("entries with missing or malformed fields are refused") {
  const std::string data(8, '\0');
  check_refused(file_image("{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", data), "has no \"dtype\"");
  check_refused(file_image("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", data), "has no \"shape\"");
  check_refused(file_image("{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", data), "has no \"data_offsets\"");
  check_refused(file_image("{\"a\":{\"dtype\":\"F8_E4M3\",\"shape\":[8],\"data_offsets\":[0,8]}}", data),
                "unsupported dtype \"F8_E4M3\"");
  check_refused(file_image("{\"a\":{\"dtype\":4,\"shape\":[2],\"data_offsets\":[0,8]}}", data), "\"dtype\" is number");
  check_refused(file_image("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", data),
                "must be non-negative integers, found -2");
  check_refused(file_image("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,8]}}", data),
                "must be non-negative integers, found 1.5");
  check_refused(file_image("{\"a\":{\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]}}", data),
                "\"shape\" must be an array");
  std::string rank65 = "[1";
  for (int i = 1; i < 65; ++i) rank65 += ",1";
  check_refused(file_image("{\"a\":{\"dtype\":\"U8\",\"shape\":" + rank65 + "],\"data_offsets\":[0,1]}}", "x"),
                "at most 64");
  check_refused(file_image("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", data),
                "must be [begin, end]");
  check_refused(file_image("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}}", data),
                "must be non-negative integers, found -8");
}

TEST_CASE("shapes whose size overflows are refused before anything is allocated") {
  const std::string data(8, '\0');
  check_refused(
      file_image("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,8]}}",
                 data),
      "more elements than fit in 64 bits");
  check_refused(file_image("{\"a\":{\"dtype\":\"F64\",\"shape\":[2305843009213693952,4],\"data_offsets\":[0,8]}}",
                           data),
                "more bytes than fit in 64 bits");
  check_refused(file_image("{\"a\":{\"dtype\":\"F32\",\"shape\":[18446744073709551615],\"data_offsets\":[0,8]}}", data),
                "is too large");
  // Huge but not overflowing: caught by the byte count, still before any allocation.
  check_refused(file_image("{\"a\":{\"dtype\":\"F32\",\"shape\":[1000000000000],\"data_offsets\":[0,8]}}", data),
                "needs 4000000000000");
}

TEST_CASE("offsets outside the data, wrong byte counts, overlaps, gaps and truncation are refused") {
  check_refused(file_image(json_object({f32_entry("a", 4, 0)}), std::string(8, '\0')), "fall outside the 8 data bytes");
  check_refused(file_image("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", std::string(8, '\0')),
                "fall outside");
  check_refused(file_image("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", std::string(8, '\0')),
                "hold 8 bytes but f32[3] needs 12");
  check_refused(file_image("{\"a\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[0,8]}}", std::string(8, '\0')),
                "hold 8 bytes but i64[2] needs 16");
  check_refused(file_image(json_object({f32_entry("a", 2, 0), f32_entry("b", 2, 4)}), std::string(12, '\0')),
                "overlaps tensor");
  check_refused(file_image(json_object({f32_entry("a", 2, 0), f32_entry("b", 2, 0)}), std::string(8, '\0')),
                "overlaps tensor");
  // An empty tensor may sit at a boundary, not inside another tensor.
  check_refused(file_image(json_object({f32_entry("a", 2, 0),
                                        "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]}"}),
                           std::string(8, '\0')),
                "overlaps tensor");
  check_refused(file_image(json_object({f32_entry("a", 1, 0), f32_entry("b", 1, 8)}), std::string(12, '\0')),
                "data bytes [4, 8) before tensor \"b\" belong to no tensor");
  check_refused(file_image(json_object({f32_entry("a", 2, 0)}), std::string(12, '\0')),
                "the last 4 data bytes belong to no tensor");
  // A whole valid file cut short by one byte: its last tensor now reaches past the end.
  TempDir dir;
  save_safetensors(dir.file("t.safetensors"), every_dtype());
  std::string bytes = read_bytes(dir.file("t.safetensors"));
  bytes.pop_back();
  check_refused(bytes, "truncated");
}

TEST_CASE("metadata must be an object of strings") {
  check_refused(file_image("{\"__metadata__\":{\"epoch\":3}}"),
                "__metadata__ value \"epoch\" is not a string but number");
  check_refused(file_image("{\"__metadata__\":{\"x\":null}}"), "is not a string but null");
  check_refused(file_image("{\"__metadata__\":[\"a\"]}"), "__metadata__ is array");
}

TEST_CASE("edge cases a valid writer produces are accepted") {
  // Empty tensors sharing a boundary, padding spaces after the JSON, metadata anywhere in the object.
  const std::string text = json_object({"\"e1\":{\"dtype\":\"F32\",\"shape\":[0,3],\"data_offsets\":[0,0]}",
                                        f32_entry("a", 1, 0), "\"__metadata__\":{}",
                                        "\"e2\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,4]}"}) +
                           "    ";
  SafetensorsFile file = parse_safetensors(file_image(text, std::string("\x00\x00\x80\x3f", 4)), "ok");
  REQUIRE(file.tensors.size() == 3);
  CHECK(file.get("a").item<float>() == 1.f);
  CHECK(file.get("e1").shape() == Shape{0, 3});
  CHECK(file.metadata.empty());
}

TEST_CASE("load_safetensors names the path for missing, empty, directory and truncated files") {
  TempDir dir;
  CHECK_THROWS_WITH_AS(load_safetensors(dir.file("missing.safetensors")), doctest::Contains("cannot open"), Error);
  CHECK_THROWS_WITH_AS(load_safetensors(dir.path.string()), doctest::Contains("is not a regular file"), Error);
  write_bytes(dir.file("empty.safetensors"), "");
  CHECK_THROWS_WITH_AS(load_safetensors(dir.file("empty.safetensors")), doctest::Contains("empty.safetensors is empty"),
                       Error);
  write_bytes(dir.file("seven.safetensors"), "1234567");
  CHECK_THROWS_WITH_AS(load_safetensors(dir.file("seven.safetensors")), doctest::Contains("fewer than the 8-byte"),
                       Error);
  save_safetensors(dir.file("cut.safetensors"), every_dtype());
  std::string bytes = read_bytes(dir.file("cut.safetensors"));
  write_bytes(dir.file("cut.safetensors"), bytes.substr(0, bytes.size() / 2));
  CHECK_THROWS_WITH_AS(load_safetensors(dir.file("cut.safetensors")), doctest::Contains("cut.safetensors"), Error);
  write_bytes(dir.file("header_cut.safetensors"), bytes.substr(0, 20));
  CHECK_THROWS_WITH_AS(load_safetensors(dir.file("header_cut.safetensors")), doctest::Contains("the file is truncated"),
                       Error);
}

TEST_CASE("save_safetensors refuses bad names and leaves no file behind") {
  TempDir dir;
  const std::string path = dir.file("x.safetensors");
  const Tensor t = Tensor::zeros({2});
  CHECK_THROWS_WITH_AS(save_safetensors(path, {{"a", t}, {"a", t}}), doctest::Contains("\"a\" appears twice"), Error);
  CHECK_THROWS_WITH_AS(save_safetensors(path, {{"", t}}), doctest::Contains("invalid tensor name"), Error);
  CHECK_THROWS_WITH_AS(save_safetensors(path, {{"__metadata__", t}}), doctest::Contains("invalid tensor name"), Error);
  CHECK_THROWS_WITH_AS(save_safetensors(path, {{"u", Tensor()}}), doctest::Contains("\"u\" is undefined"), Error);
  CHECK_THROWS_WITH_AS(save_safetensors(path, {{"bad\xff", t}}), doctest::Contains("not valid UTF-8"), Error);
  CHECK_THROWS_WITH_AS(save_safetensors(path, {}, {{"k", "\xc3"}}), doctest::Contains("not valid UTF-8"), Error);
  CHECK_THROWS_WITH_AS(save_safetensors(dir.file("no/such/dir/x.safetensors"), {{"a", t}}),
                       doctest::Contains("cannot create"), Error);
  CHECK(std::filesystem::is_empty(dir.path));  // neither the file nor a temporary one
}

TEST_CASE("saving replaces the old file whole and leaves no temporary file; stray ones are ignored") {
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  save_safetensors(path, {{"w", Tensor::from_vector<float>({1.f, 2.f})}});
  // What a crash between creating and renaming the temporary file leaves behind.
  write_bytes(path + ".tmp.99999.0", "garbage from a crashed save");
  save_safetensors(path, {{"w", Tensor::from_vector<float>({3.f, 4.f, 5.f})}});
  CHECK(load_safetensors(path).get("w").to_vector<float>() == std::vector<float>{3.f, 4.f, 5.f});
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path))
    names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"model.safetensors", "model.safetensors.tmp.99999.0"});
}

TEST_CASE("seeded mutations of a valid file are parsed or refused with tinyddp::Error, never anything else") {
  TempDir dir;
  save_safetensors(dir.file("seed.safetensors"), every_dtype(), {{"format", "pt"}, {"k", "v"}});
  const std::string valid = read_bytes(dir.file("seed.safetensors"));
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<unsigned char>(valid[size_t(i)]);

  Generator rng(20240611);
  auto below = [&](size_t n) { return size_t(rng.next_below(uint64_t(n))); };
  int accepted = 0, refused = 0;
  for (int round = 0; round < 3000; ++round) {
    std::string bytes = valid;
    switch (round % 6) {
      case 0:  // flip a few random bytes anywhere
        for (size_t k = 1 + below(4); k > 0; --k) bytes[below(bytes.size())] = char(below(256));
        break;
      case 1:  // truncate anywhere
        bytes.resize(below(bytes.size()));
        break;
      case 2: {  // rewrite the length prefix: near the true value, or anything
        uint64_t n = round % 12 == 2 ? header_len + below(33) - 16
                                     : (uint64_t(below(1u << 30)) << 34) ^ below(1u << 30);
        for (int i = 0; i < 8; ++i) bytes[size_t(i)] = char(n >> (8 * i));
        break;
      }
      case 3: {  // change a digit of the header (shapes, offsets) to another digit or a sign
        size_t at = 8 + below(header_len);
        for (size_t tries = 0; tries < 64 && !std::isdigit(static_cast<unsigned char>(bytes[at])); ++tries)
          at = 8 + below(header_len);
        bytes[at] = "0123456789-9"[below(12)];
        break;
      }
      case 4: {  // insert or delete a few bytes inside the header
        size_t at = 8 + below(header_len);
        if (round % 12 == 4)
          bytes.insert(at, std::string(1 + below(3), "{}[],:\"0"[below(8)]));
        else
          bytes.erase(at, 1 + below(3));
        break;
      }
      case 5:  // a valid file with random bytes appended
        bytes += std::string(1 + below(16), char(below(256)));
        break;
    }
    INFO("round ", round);
    try {
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    } catch (const std::exception& e) {
      FAIL("the fuzz entry let through an exception that is not tinyddp::Error: " << e.what());
    }
    try {
      parse_safetensors(bytes, "mutant");
      ++accepted;
    } catch (const Error&) {
      ++refused;
    }
  }
  // Both outcomes occur, so the mutations really reach the reader's checks and its success path.
  CHECK(accepted > 100);
  CHECK(refused > 1000);
}
