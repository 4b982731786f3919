// Fuzz target for the store's wire format (comm/store/store_protocol.h): the code that reads bytes
// straight off the network.
//
// Properties checked on every input, beyond "does not crash, leak or read out of bounds":
//   - decoding either succeeds or throws tinyddp::Error (never anything else);
//   - what decodes, re-encodes to exactly the same bytes (the format is canonical, so a decoder that
//     skipped or misread a field would show up here);
//   - no decoded key or value is larger than the limits allow.
//
// Built two ways (test/fuzz/CMakeLists.txt):
//   - with clang's libFuzzer (-DTINYDDP_LIBFUZZER), which explores coverage-guided:
//       bin/fuzz_store_frame_libfuzzer -max_total_time=60
//   - with any compiler, with the seeded driver below, which replays valid frames of every command,
//     their mutations and random bytes (a few seconds in `make test`).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "tinyddp/comm/store/store_protocol.h"
#include "tinyddp/core/error.h"

using namespace tinyddp::comm::protocol;

namespace {

// Small limits, so inputs of a few hundred bytes reach every bound.
Limits fuzz_limits() {
  Limits limits;
  limits.max_key_bytes = 64;
  limits.max_value_bytes = 4096;
  limits.max_keys_per_request = 64;
  return limits;
}

void require(bool condition, const char* what) {
  if (!condition) {
    std::fprintf(stderr, "fuzz_store_frame: property violated: %s\n", what);
    std::abort();
  }
}

void check_sizes(const std::vector<std::string>& items, uint64_t max_bytes, const Limits& limits) {
  require(items.size() <= limits.max_keys_per_request, "more items than max_keys_per_request");
  for (const auto& item : items) require(item.size() <= max_bytes, "an item over its size limit");
}

void fuzz_request(std::string_view body, const Limits& limits) {
  Request request;
  try {
    request = decode_request(body, limits);
  } catch (const tinyddp::Error&) {
    return;
  }
  check_sizes(request.keys, limits.max_key_bytes, limits);
  check_sizes(request.values, limits.max_value_bytes, limits);
  std::string frame = encode_request(request);
  require(frame.substr(kFrameLengthBytes) == body, "request does not re-encode to the same bytes");
  require(decode_frame_length(std::string_view(frame).substr(0, kFrameLengthBytes), limits) == body.size(),
          "frame length prefix disagrees with the body");
}

void fuzz_response(Command command, std::string_view body, const Limits& limits) {
  Response response;
  try {
    response = decode_response(command, body, limits);
  } catch (const tinyddp::Error&) {
    return;
  }
  std::string frame = encode_response(command, response);
  require(frame.substr(kFrameLengthBytes) == body, "response does not re-encode to the same bytes");
}

void fuzz_hello(std::string_view bytes) {
  if (bytes.size() < kHelloReplyHeadBytes) return;
  try {
    uint16_t version = 0;
    uint32_t token = decode_hello_head(bytes.substr(0, kHelloHeadBytes), version);
    require(token <= kMaxTokenBytes, "token length over its bound");
  } catch (const tinyddp::Error&) {}
  try {
    HelloReply reply;
    uint32_t message = decode_hello_reply_head(bytes.substr(0, kHelloReplyHeadBytes), reply);
    require(message <= kMaxMessageBytes, "hello message length over its bound");
  } catch (const tinyddp::Error&) {}
}

// What the server does with a byte stream: length prefix, body, next frame.
void fuzz_stream(std::string_view bytes, const Limits& limits) {
  while (bytes.size() >= kFrameLengthBytes) {
    uint32_t length = 0;
    try {
      length = decode_frame_length(bytes.substr(0, kFrameLengthBytes), limits);
    } catch (const tinyddp::Error&) {
      return;
    }
    require(length <= limits.max_frame_bytes(), "frame length over the bound was accepted");
    bytes.remove_prefix(kFrameLengthBytes);
    if (bytes.size() < length) return;
    fuzz_request(bytes.substr(0, length), limits);
    bytes.remove_prefix(length);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  static const Limits limits = fuzz_limits();
  std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 4) {
    case 0: fuzz_request(rest, limits); break;
    case 1: fuzz_response(Command(uint8_t(rest[0]) % 11 + 1), rest.substr(1), limits); break;
    case 2: fuzz_hello(rest); break;
    case 3: fuzz_stream(rest, limits); break;
  }
  return 0;
}

#ifndef TINYDDP_LIBFUZZER
// The seeded driver: valid frames of every command and status, then mutations of them (bit flips,
// truncations, insertions, rewritten length fields), then plain random bytes.
int main(int argc, char** argv) {
  long iterations = argc > 1 ? std::atol(argv[1]) : 200000;
  std::mt19937 random(20240601);
  std::vector<std::string> seeds;
  for (uint8_t c = 1; c <= 11; ++c) {
    Request q;
    q.command = Command(c);
    q.keys = {"key"};
    q.values = {"value"};
    if (q.command == Command::compare_set) q.values = {"old", "new"};
    if (q.command == Command::check || q.command == Command::wait || q.command == Command::multi_get)
      q.keys = {"a", "bb"};
    if (q.command == Command::multi_set) q.keys = {"a", "b"}, q.values = {"1", "22"};
    if (q.command == Command::num_keys) q.keys.clear();
    q.delta = -5;
    q.timeout_ms = 1234;
    std::string frame = encode_request(q);
    seeds.push_back(std::string(1, '\0') + frame.substr(kFrameLengthBytes));  // selector 0: one request body
    seeds.push_back(std::string(1, '\3') + frame + frame);                    // selector 3: a stream of two
    Response r;
    r.values = {"v"};
    r.number = 1;
    seeds.push_back(std::string(1, '\1') + char(c - 1) + encode_response(q.command, r).substr(kFrameLengthBytes));
    r.status = Status::timeout;
    r.values = {"missing"};
    seeds.push_back(std::string(1, '\1') + char(c - 1) + encode_response(q.command, r).substr(kFrameLengthBytes));
  }
  seeds.push_back(std::string(1, '\2') + encode_hello({kMagic, kVersion, "token"}) + std::string(16, '\0'));
  seeds.push_back(std::string(1, '\2') + encode_hello_reply({kVersion, HelloStatus::ok, 64, 4096, "hi"}));

  auto run = [](const std::string& input) {
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
  };
  for (const auto& seed : seeds) run(seed);
  for (long i = 0; i < iterations; ++i) {
    std::string input;
    if (i % 8 == 7) {
      input.resize(random() % 96);
      for (auto& c : input) c = char(random());
    } else {
      input = seeds[random() % seeds.size()];
      int edits = 1 + random() % 4;
      for (int e = 0; e < edits && input.size() > 1; ++e) {
        size_t at = 1 + random() % (input.size() - 1);
        switch (random() % 5) {
          case 0: input[at] = char(input[at] ^ (1 << (random() % 8))); break;
          case 1: input.resize(at); break;
          case 2: input.insert(at, 1, char(random())); break;
          case 3: input.erase(at, 1); break;
          case 4:  // rewrite a would-be length field with an interesting value
            if (at + 4 <= input.size()) {
              static const uint32_t interesting[] = {0, 1, 63, 64, 65, 4095, 4096, 4097, 0x7fffffff, 0xffffffff};
              uint32_t v = interesting[random() % 10];
              for (int b = 0; b < 4; ++b) input[at + b] = char(v >> (8 * b));
            }
            break;
        }
      }
    }
    run(input);
  }
  std::printf("fuzz_store_frame: %ld inputs, no property violated\n", iterations + long(seeds.size()));
  return 0;
}
#endif
