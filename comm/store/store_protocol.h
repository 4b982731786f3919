// The TCP store's wire format: what a TcpStore client and the StoreServer say to each other.
//
// Everything is little-endian. Strings and byte values are length-prefixed (u32 length, then the
// bytes); a list is a u32 count followed by that many strings. Nothing is ever allocated from a
// length that has not first been checked against the remaining bytes of its frame and the limits.
//
// 1. Handshake, once per connection, client first:
//
//      client -> server   u32 magic 'TDDS' (0x53444454)   u16 version   u16 reserved (0)
//                         u32 token length (<= 1024)      token bytes
//      server -> client   u32 magic   u16 server version   u16 status (HelloStatus)
//                         u32 max key bytes   u64 max value bytes   u32 message length   message
//
//    The server replies to a well-formed hello even when it rejects it (wrong version, wrong token),
//    so the client can say why, then closes. To a wrong magic it says nothing: the peer is not a
//    tinyddp client. The limits in the reply let the client refuse an oversized call itself, with a
//    clear message, before sending anything.
//
// 2. Requests and responses, one at a time per connection (no pipelining):
//
//      frame    = u32 body length (<= max_frame_bytes)   body
//      request  = u8 command   arguments (below)
//      response = u8 status (Status)   payload: ok -> per command (below); timeout -> list of the
//                 keys still missing; error -> string message
//
//      command       arguments                              ok payload
//      set           key, value                              -
//      get           u64 timeout ms, key                     value        (waits for the key)
//      add           key, i64 delta                          i64 new value
//      compare_set   key, expected, desired                  value after the operation
//      check         list keys                               u8 all exist
//      wait          u64 timeout ms, list keys               -            (waits for every key)
//      delete_key    key                                     u8 existed
//      num_keys      -                                       i64 count
//      append        key, value                              -
//      multi_get     u64 timeout ms, list keys               list values  (waits for every key)
//      multi_set     list keys, list values                  -
//
//    A waiting command is answered by the server the moment its keys exist, or with `timeout` when its
//    timeout passes. Either way the connection stays usable.
//
// A frame that breaks these rules (a length over the limit, an unknown command, bytes left over or
// missing) is a protocol error: the server closes that one connection and logs why.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tinyddp::comm::protocol {

inline constexpr uint32_t kMagic = 0x53444454;  // the bytes "TDDS" on the wire
inline constexpr uint16_t kVersion = 1;
inline constexpr size_t kHelloHeadBytes = 12;       // magic, version, reserved, token length
inline constexpr size_t kHelloReplyHeadBytes = 24;  // magic .. message length
inline constexpr size_t kFrameLengthBytes = 4;
inline constexpr uint32_t kMaxTokenBytes = 1024;
inline constexpr uint32_t kMaxMessageBytes = 4096;

// Size bounds, checked before any allocation. The frame bound leaves room for the keys and headers
// of a request carrying one maximal value.
struct Limits {
  uint32_t max_key_bytes = 4096;
  uint64_t max_value_bytes = 64ull << 20;
  uint32_t max_keys_per_request = 1u << 16;

  uint64_t max_frame_bytes() const { return max_value_bytes + (1ull << 20); }
};

enum class Command : uint8_t {
  set = 1,
  get = 2,
  add = 3,
  compare_set = 4,
  check = 5,
  wait = 6,
  delete_key = 7,
  num_keys = 8,
  append = 9,
  multi_get = 10,
  multi_set = 11,
};
const char* command_name(Command command);
// True for the commands the server may hold until keys appear.
bool command_waits(Command command);

enum class Status : uint8_t { ok = 0, timeout = 1, error = 2 };

enum class HelloStatus : uint16_t { ok = 0, bad_version = 1, bad_token = 2 };

// One request. Which fields a command uses is the table above; the others stay empty.
struct Request {
  Command command = Command::num_keys;
  std::vector<std::string> keys;    // one key for set/get/add/compare_set/delete_key/append
  std::vector<std::string> values;  // set/append: 1; compare_set: expected, desired; multi_set: one per key
  int64_t delta = 0;                // add
  uint64_t timeout_ms = 0;          // get, wait, multi_get

  friend bool operator==(const Request&, const Request&) = default;
};

struct Response {
  Status status = Status::ok;
  std::vector<std::string> values;  // get, compare_set: 1; multi_get: one per key; timeout: the missing keys
  int64_t number = 0;               // add, num_keys; check and delete_key as 0/1
  std::string message;              // error

  friend bool operator==(const Response&, const Response&) = default;
};

struct Hello {
  uint32_t magic = kMagic;
  uint16_t version = kVersion;
  std::string token;
};

struct HelloReply {
  uint16_t version = kVersion;
  HelloStatus status = HelloStatus::ok;
  uint32_t max_key_bytes = 0;
  uint64_t max_value_bytes = 0;
  std::string message;
};

// --- encoding (each returns the bytes to send, length prefix included) -------------------------
std::string encode_hello(const Hello& hello);
std::string encode_hello_reply(const HelloReply& reply);
std::string encode_request(const Request& request);
std::string encode_response(Command command, const Response& response);

// --- decoding (each throws tinyddp::Error naming what is wrong) --------------------------------
// The fixed 12-byte head of a hello: checks the magic and the token length; returns the token length.
// `version` receives the client's version, which the caller compares (to reply, not just close).
uint32_t decode_hello_head(std::string_view head, uint16_t& version);
// The fixed 24-byte head of a hello reply; returns the length of the message that follows.
uint32_t decode_hello_reply_head(std::string_view head, HelloReply& reply);
// A frame's u32 length prefix, checked against limits.max_frame_bytes().
uint32_t decode_frame_length(std::string_view prefix, const Limits& limits);
Request decode_request(std::string_view body, const Limits& limits);
Response decode_response(Command command, std::string_view body, const Limits& limits);

// Checks what the server checks, on the client's side: key and value sizes against the limits, and
// that the whole frame fits. Throws with a message naming the key and the limit.
void check_request_fits(const Request& request, const Limits& limits);

}  // namespace tinyddp::comm::protocol
