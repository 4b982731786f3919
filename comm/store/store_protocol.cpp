#include "tinyddp/comm/store/store_protocol.h"

#include <cstring>

#include "tinyddp/core/error.h"

namespace tinyddp::comm::protocol {

namespace {

// Appends little-endian integers and length-prefixed strings. Built for x86/ARM hosts, which are
// little-endian; the byte-by-byte shifts keep it correct on any host anyway.
class Writer {
 public:
  void u8(uint8_t v) { out_.push_back(char(v)); }
  void u16(uint16_t v) { integer(v, 2); }
  void u32(uint32_t v) { integer(v, 4); }
  void u64(uint64_t v) { integer(v, 8); }
  void i64(int64_t v) { integer(uint64_t(v), 8); }
  void str(std::string_view s) {
    u32(uint32_t(s.size()));
    out_.append(s);
  }
  void list(const std::vector<std::string>& items) {
    u32(uint32_t(items.size()));
    for (const auto& s : items) str(s);
  }
  // Frames carry their body length first; reserve it and patch it in `frame()`.
  void begin_frame() { u32(0); }
  std::string frame() {
    uint64_t body = out_.size() - kFrameLengthBytes;
    for (int i = 0; i < 4; ++i) out_[i] = char((body >> (8 * i)) & 0xff);
    return std::move(out_);
  }
  std::string bytes() { return std::move(out_); }

 private:
  void integer(uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out_.push_back(char((v >> (8 * i)) & 0xff));
  }
  std::string out_;
};

// Reads the same, refusing to step past the end of its input: every length is compared with the
// bytes that remain *before* a string is built from it, so a lying length cannot make us allocate.
class Reader {
 public:
  Reader(std::string_view in, const char* what) : in_(in), what_(what) {}

  uint8_t u8() { return uint8_t(integer(1)); }
  uint16_t u16() { return uint16_t(integer(2)); }
  uint32_t u32() { return uint32_t(integer(4)); }
  uint64_t u64() { return integer(8); }
  int64_t i64() { return int64_t(integer(8)); }

  std::string str(uint64_t max_bytes, const char* field) {
    uint32_t n = u32();
    TINYDDP_CHECK(n <= max_bytes, what_, ": ", field, " of ", n, " bytes is over the limit of ", max_bytes, " bytes",
                  hint("keys are short names and values are bounded by the store's max value size"));
    need(n, field);
    std::string s(in_.substr(at_, n));
    at_ += n;
    return s;
  }
  std::vector<std::string> list(uint32_t max_count, uint64_t max_bytes, const char* field) {
    uint32_t count = u32();
    TINYDDP_CHECK(count <= max_count, what_, ": a list of ", count, " ", field, "s is over the limit of ", max_count,
                  hint("split the call into smaller ones"));
    // Each entry needs at least its 4-byte length: a count the remaining bytes cannot hold is a lie.
    TINYDDP_CHECK(uint64_t(count) * 4 <= remaining(), what_, ": claims ", count, " ", field, "s but only ", remaining(),
                  " bytes follow", hint("the frame is truncated or corrupt"));
    std::vector<std::string> items;
    items.reserve(count);
    for (uint32_t i = 0; i < count; ++i) items.push_back(str(max_bytes, field));
    return items;
  }
  size_t remaining() const { return in_.size() - at_; }
  void expect_end() {
    TINYDDP_CHECK(remaining() == 0, what_, ": ", remaining(), " unexpected bytes after the last field",
                  hint("client and server disagree on the format"));
  }

 private:
  void need(uint64_t n, const char* field) {
    TINYDDP_CHECK(n <= remaining(), what_, ": ", field, " needs ", n, " bytes but only ", remaining(), " remain",
                  hint("the frame is truncated or corrupt"));
  }
  uint64_t integer(int bytes) {
    need(bytes, "an integer");
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= uint64_t(uint8_t(in_[at_ + i])) << (8 * i);
    at_ += bytes;
    return v;
  }
  std::string_view in_;
  size_t at_ = 0;
  const char* what_;
};

Command checked_command(uint8_t byte) {
  TINYDDP_CHECK(byte >= uint8_t(Command::set) && byte <= uint8_t(Command::multi_set), "request: unknown command 0x",
                std::hex, int(byte), hint("the peer speaks another protocol version or is not a tinyddp client"));
  return Command(byte);
}

}  // namespace

const char* command_name(Command command) {
  switch (command) {
    case Command::set: return "set";
    case Command::get: return "get";
    case Command::add: return "add";
    case Command::compare_set: return "compare_set";
    case Command::check: return "check";
    case Command::wait: return "wait";
    case Command::delete_key: return "delete_key";
    case Command::num_keys: return "num_keys";
    case Command::append: return "append";
    case Command::multi_get: return "multi_get";
    case Command::multi_set: return "multi_set";
  }
  return "unknown";
}

bool command_waits(Command command) {
  return command == Command::get || command == Command::wait || command == Command::multi_get;
}

std::string encode_hello(const Hello& hello) {
  Writer w;
  w.u32(hello.magic);
  w.u16(hello.version);
  w.u16(0);
  w.str(hello.token);
  return w.bytes();
}

std::string encode_hello_reply(const HelloReply& reply) {
  Writer w;
  w.u32(kMagic);
  w.u16(reply.version);
  w.u16(uint16_t(reply.status));
  w.u32(reply.max_key_bytes);
  w.u64(reply.max_value_bytes);
  w.str(reply.message.substr(0, kMaxMessageBytes));
  return w.bytes();
}

std::string encode_request(const Request& r) {
  Writer w;
  w.begin_frame();
  w.u8(uint8_t(r.command));
  switch (r.command) {
    case Command::set:
    case Command::append:
      w.str(r.keys.at(0));
      w.str(r.values.at(0));
      break;
    case Command::get:
      w.u64(r.timeout_ms);
      w.str(r.keys.at(0));
      break;
    case Command::add:
      w.str(r.keys.at(0));
      w.i64(r.delta);
      break;
    case Command::compare_set:
      w.str(r.keys.at(0));
      w.str(r.values.at(0));
      w.str(r.values.at(1));
      break;
    case Command::check: w.list(r.keys); break;
    case Command::wait:
    case Command::multi_get:
      w.u64(r.timeout_ms);
      w.list(r.keys);
      break;
    case Command::delete_key: w.str(r.keys.at(0)); break;
    case Command::num_keys: break;
    case Command::multi_set:
      w.list(r.keys);
      w.list(r.values);
      break;
  }
  return w.frame();
}

std::string encode_response(Command command, const Response& r) {
  Writer w;
  w.begin_frame();
  w.u8(uint8_t(r.status));
  if (r.status == Status::timeout) {
    w.list(r.values);
  } else if (r.status == Status::error) {
    w.str(r.message.substr(0, kMaxMessageBytes));
  } else {
    switch (command) {
      case Command::get:
      case Command::compare_set: w.str(r.values.at(0)); break;
      case Command::add:
      case Command::num_keys: w.i64(r.number); break;
      case Command::check:
      case Command::delete_key: w.u8(r.number != 0); break;
      case Command::multi_get: w.list(r.values); break;
      case Command::set:
      case Command::wait:
      case Command::append:
      case Command::multi_set: break;
    }
  }
  return w.frame();
}

uint32_t decode_hello_head(std::string_view head, uint16_t& version) {
  Reader r(head, "hello");
  uint32_t magic = r.u32();
  TINYDDP_CHECK(magic == kMagic, "hello: wrong magic number 0x", std::hex, magic, " (expected 0x", kMagic, ")",
                hint("the peer is not a tinyddp store client (a port scanner, or another service on this port)"));
  version = r.u16();
  r.u16();  // reserved
  uint32_t token_bytes = r.u32();
  TINYDDP_CHECK(token_bytes <= kMaxTokenBytes, "hello: token of ", token_bytes, " bytes is over the limit of ",
                kMaxTokenBytes, hint("TINYDDP_TOKEN should be a short random string"));
  return token_bytes;
}

uint32_t decode_hello_reply_head(std::string_view head, HelloReply& reply) {
  Reader r(head, "hello reply");
  uint32_t magic = r.u32();
  TINYDDP_CHECK(magic == kMagic, "hello reply: wrong magic number 0x", std::hex, magic,
                hint("the address is not a tinyddp store (check MASTER_ADDR/MASTER_PORT)"));
  reply.version = r.u16();
  reply.status = HelloStatus(r.u16());
  reply.max_key_bytes = r.u32();
  reply.max_value_bytes = r.u64();
  uint32_t message_bytes = r.u32();
  TINYDDP_CHECK(message_bytes <= kMaxMessageBytes, "hello reply: message of ", message_bytes,
                " bytes is over the limit of ", kMaxMessageBytes, hint("the peer is not a tinyddp store"));
  return message_bytes;
}

uint32_t decode_frame_length(std::string_view prefix, const Limits& limits) {
  Reader r(prefix, "frame");
  uint32_t length = r.u32();
  TINYDDP_CHECK(length >= 1 && length <= limits.max_frame_bytes(), "frame: claimed length of ", length,
                " bytes is outside 1..", limits.max_frame_bytes(),
                hint("the peer is not a tinyddp store or client, or its limits differ (a store's values are "
                     "limited to Limits::max_value_bytes, tinyddp-store --max-value-bytes)"));
  return length;
}

Request decode_request(std::string_view body, const Limits& limits) {
  Reader r(body, "request");
  Request q;
  q.command = checked_command(r.u8());
  auto key = [&] { return r.str(limits.max_key_bytes, "key"); };
  auto value = [&] { return r.str(limits.max_value_bytes, "value"); };
  auto keys = [&] { return r.list(limits.max_keys_per_request, limits.max_key_bytes, "key"); };
  switch (q.command) {
    case Command::set:
    case Command::append:
      q.keys = {key()};
      q.values = {value()};
      break;
    case Command::get:
      q.timeout_ms = r.u64();
      q.keys = {key()};
      break;
    case Command::add:
      q.keys = {key()};
      q.delta = r.i64();
      break;
    case Command::compare_set:
      q.keys = {key()};
      q.values.push_back(value());
      q.values.push_back(value());
      break;
    case Command::check: q.keys = keys(); break;
    case Command::wait:
    case Command::multi_get:
      q.timeout_ms = r.u64();
      q.keys = keys();
      break;
    case Command::delete_key: q.keys = {key()}; break;
    case Command::num_keys: break;
    case Command::multi_set:
      q.keys = keys();
      q.values = r.list(limits.max_keys_per_request, limits.max_value_bytes, "value");
      TINYDDP_CHECK(q.keys.size() == q.values.size(), "request: multi_set with ", q.keys.size(), " keys but ",
                    q.values.size(), " values", hint("pass one value per key"));
      break;
  }
  r.expect_end();
  return q;
}

Response decode_response(Command command, std::string_view body, const Limits& limits) {
  Reader r(body, "response");
  Response p;
  uint8_t status = r.u8();
  TINYDDP_CHECK(status <= uint8_t(Status::error), "response: unknown status ", int(status),
                hint("client and server versions differ"));
  p.status = Status(status);
  auto value = [&] { return r.str(limits.max_value_bytes, "value"); };
  if (p.status == Status::timeout) {
    p.values = r.list(limits.max_keys_per_request, limits.max_key_bytes, "key");
  } else if (p.status == Status::error) {
    p.message = r.str(kMaxMessageBytes, "message");
  } else {
    switch (command) {
      case Command::get:
      case Command::compare_set: p.values = {value()}; break;
      case Command::add:
      case Command::num_keys: p.number = r.i64(); break;
      case Command::check:
      case Command::delete_key: {
        uint8_t flag = r.u8();
        TINYDDP_CHECK(flag <= 1, "response: boolean byte ", int(flag), " is neither 0 nor 1",
                      hint("the peer is not a "
                           "tinyddp store of this version"));
        p.number = flag;
        break;
      }
      case Command::multi_get: p.values = r.list(limits.max_keys_per_request, limits.max_value_bytes, "value"); break;
      case Command::set:
      case Command::wait:
      case Command::append:
      case Command::multi_set: break;
    }
  }
  r.expect_end();
  return p;
}

void check_request_fits(const Request& request, const Limits& limits) {
  const char* name = command_name(request.command);
  TINYDDP_CHECK(request.keys.size() <= limits.max_keys_per_request, "store ", name, ": ", request.keys.size(),
                " keys in one call, over the limit of ", limits.max_keys_per_request,
                hint("split the call into smaller ones"));
  for (const auto& key : request.keys)
    TINYDDP_CHECK(key.size() <= limits.max_key_bytes, "store ", name, ": key '", key.substr(0, 64), "...' is ",
                  key.size(), " bytes, over the limit of ", limits.max_key_bytes, " bytes",
                  hint("keys are names, put the data in the value"));
  uint64_t total = 64;
  for (const auto& key : request.keys) total += key.size() + 4;
  for (size_t i = 0; i < request.values.size(); ++i) {
    const auto& v = request.values[i];
    TINYDDP_CHECK(v.size() <= limits.max_value_bytes, "store ", name, ": value for key '",
                  request.keys.empty() ? "" : request.keys[std::min(i, request.keys.size() - 1)], "' is ", v.size(),
                  " bytes, over the store's limit of ", limits.max_value_bytes, " bytes",
                  hint("split the value over several keys, or raise the store's limit (TcpStoreOptions::limits "
                       "where rank 0 hosts it, tinyddp-store --max-value-bytes)"));
    total += v.size() + 4;
  }
  TINYDDP_CHECK(total <= limits.max_frame_bytes(), "store ", name, ": the request is ", total,
                " bytes in all, over the frame limit of ", limits.max_frame_bytes(), " bytes",
                hint("split it into several calls"));
}

}  // namespace tinyddp::comm::protocol
