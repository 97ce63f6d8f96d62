#include "collectives/store/store_protocol.h"

#include "runtime/fmt.h"

#include <algorithm>
#include <array>

namespace ddp {
namespace {

enum class Field : uint8_t { kKey, kKeys, kValue, kDesired, kNumber, kText };

struct Layout {
  Command command;
  const char* name;
  std::vector<Field> fields;
};

// The single source of truth for the wire format (see the table in the header).
const std::array<Layout, 16>& layouts() {
  using F = Field;
  static const std::array<Layout, 16> table = {{
      {Command::kHello, "HELLO", {F::kText}},
      {Command::kSet, "SET", {F::kKey, F::kValue}},
      {Command::kGet, "GET", {F::kKey, F::kNumber}},
      {Command::kAdd, "ADD", {F::kKey, F::kNumber}},
      {Command::kWait, "WAIT", {F::kKeys, F::kNumber}},
      {Command::kCompareSet, "COMPARE_SET", {F::kKey, F::kValue, F::kDesired}},
      {Command::kDelete, "DELETE", {F::kKey}},
      {Command::kCheck, "CHECK", {F::kKeys}},
      {Command::kTime, "TIME", {}},
      {Command::kOnClose, "ON_CLOSE", {F::kKey, F::kValue}},
      {Command::kReplicate, "REPLICATE", {}},
      {Command::kOk, "OK", {}},
      {Command::kValue, "VALUE", {F::kValue}},
      {Command::kInt, "INT", {F::kNumber}},
      {Command::kTimeout, "TIMEOUT", {F::kKeys}},
      {Command::kError, "ERROR", {F::kText}},
  }};
  return table;
}

const Layout* find_layout(uint8_t command) {
  for (const Layout& layout : layouts()) {
    if (static_cast<uint8_t>(layout.command) == command) return &layout;
  }
  return nullptr;
}

void put_u32(Bytes& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

void put_i64(Bytes& out, int64_t v) {
  const auto u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(u >> (8 * i)));
}

template <typename Container>
void put_blob(Bytes& out, const Container& blob) {
  put_u32(out, static_cast<uint32_t>(std::min<size_t>(blob.size(), UINT32_MAX)));
  out.insert(out.end(), blob.begin(), blob.end());
}

void put_field(Bytes& out, Field field, const Message& m) {
  switch (field) {
    case Field::kKey:
      return put_blob(out, m.key);
    case Field::kValue:
      return put_blob(out, m.value);
    case Field::kDesired:
      return put_blob(out, m.desired);
    case Field::kText:
      return put_blob(out, m.text);
    case Field::kNumber:
      return put_i64(out, m.number);
    case Field::kKeys:
      put_u32(out, static_cast<uint32_t>(std::min<size_t>(m.keys.size(), UINT32_MAX)));
      for (const std::string& key : m.keys) put_blob(out, key);
      return;
  }
}

size_t field_bytes(Field field, const Message& m) {
  switch (field) {
    case Field::kKey:
      return 4 + m.key.size();
    case Field::kValue:
      return 4 + m.value.size();
    case Field::kDesired:
      return 4 + m.desired.size();
    case Field::kText:
      return 4 + m.text.size();
    case Field::kNumber:
      return 8;
    case Field::kKeys: {
      size_t bytes = 4;
      for (const std::string& key : m.keys) bytes += 4 + key.size();
      return bytes;
    }
  }
  return 0;
}

uint32_t get_u32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}

// Reads the fields of one frame body; every length is checked against the bytes
// left before anything is allocated, so memory is bounded by the frame size.
class BodyReader {
 public:
  BodyReader(const uint8_t* data, size_t bytes, const char* command)
      : p_(data), left_(bytes), command_(command) {}

  size_t left() const { return left_; }

  uint32_t u32(const char* what) {
    need(4, what);
    const uint32_t v = get_u32(p_);
    advance(4);
    return v;
  }
  int64_t i64(const char* what) {
    need(8, what);
    uint64_t u = 0;
    for (int i = 0; i < 8; ++i) u |= static_cast<uint64_t>(p_[i]) << (8 * i);
    advance(8);
    return static_cast<int64_t>(u);
  }
  template <typename Container>
  Container blob(const char* what) {
    const uint32_t bytes = u32(what);
    need(bytes, what);
    Container out(p_, p_ + bytes);
    advance(bytes);
    return out;
  }
  std::vector<std::string> keys() {
    const uint32_t count = u32("key count");
    // Each key takes at least its 4-byte length: a larger count cannot fit.
    if (count > left_ / 4) {
      throw ProtocolError(
          fmt::format("malformed store message: {} claims {} keys but only {} bytes follow",
                      command_, count, left_));
    }
    std::vector<std::string> keys;
    keys.reserve(count);
    for (uint32_t i = 0; i < count; ++i) keys.push_back(blob<std::string>("key"));
    return keys;
  }

 private:
  void need(size_t bytes, const char* what) const {
    if (bytes > left_) {
      throw ProtocolError(
          fmt::format("malformed store message: {} field '{}' is truncated (needs {} bytes, {} "
                      "left in the message)",
                      command_, what, bytes, left_));
    }
  }
  void advance(size_t bytes) {
    p_ += bytes;
    left_ -= bytes;
  }

  const uint8_t* p_;
  size_t left_;
  const char* command_;
};

void read_field(BodyReader& in, Field field, Message& m) {
  switch (field) {
    case Field::kKey:
      m.key = in.blob<std::string>("key");
      return;
    case Field::kValue:
      m.value = in.blob<Bytes>("value");
      return;
    case Field::kDesired:
      m.desired = in.blob<Bytes>("desired");
      return;
    case Field::kText:
      m.text = in.blob<std::string>("text");
      return;
    case Field::kNumber:
      m.number = in.i64("number");
      return;
    case Field::kKeys:
      m.keys = in.keys();
      return;
  }
}

Message decode_body(const uint8_t* body, size_t bytes) {
  if (bytes == 0) throw ProtocolError("malformed store message: empty frame (no command byte)");
  const Layout* layout = find_layout(body[0]);
  if (layout == nullptr) {
    throw ProtocolError(fmt::format(
        "malformed store message: unknown command {}; is the peer a ddp store of the same version?",
        body[0]));
  }
  Message m;
  m.command = layout->command;
  BodyReader in(body + 1, bytes - 1, layout->name);
  for (Field field : layout->fields) read_field(in, field, m);
  if (in.left() != 0) {
    throw ProtocolError(
        fmt::format("malformed store message: {} has {} trailing bytes", layout->name, in.left()));
  }
  return m;
}

}  // namespace

const char* command_name(Command command) {
  const Layout* layout = find_layout(static_cast<uint8_t>(command));
  return layout != nullptr ? layout->name : "UNKNOWN";
}

bool is_request(Command command) {
  return find_layout(static_cast<uint8_t>(command)) != nullptr &&
         static_cast<uint8_t>(command) < static_cast<uint8_t>(Command::kOk);
}

void encode(const Message& message, Bytes& out) {
  const Layout* layout = find_layout(static_cast<uint8_t>(message.command));
  DDP_ASSERT(layout != nullptr, "encode of unknown store command {}",
             static_cast<int>(message.command));
  size_t body = 1;
  for (Field field : layout->fields) body += field_bytes(field, message);
  if (body > kMaxMessageBytes) {
    throw ProtocolError(fmt::format(
        "store {} message for key '{}' would be {} bytes; the store carries at most {} bytes "
        "(64 MiB) per message. Keep large data out of the rendezvous store.",
        layout->name, message.key, body, kMaxMessageBytes));
  }
  out.reserve(out.size() + kFrameHeaderBytes + body);
  put_u32(out, static_cast<uint32_t>(body));
  out.push_back(static_cast<uint8_t>(message.command));
  for (Field field : layout->fields) put_field(out, field, message);
}

Bytes encode(const Message& message) {
  Bytes out;
  encode(message, out);
  return out;
}

namespace msg {
namespace {
Message with(Command command) {
  Message m;
  m.command = command;
  return m;
}
}  // namespace

Message hello(std::string secret) {
  Message m = with(Command::kHello);
  m.text = std::move(secret);
  return m;
}
Message set(std::string key, Bytes value) {
  Message m = with(Command::kSet);
  m.key = std::move(key);
  m.value = std::move(value);
  return m;
}
Message get(std::string key, int64_t timeout_ms) {
  Message m = with(Command::kGet);
  m.key = std::move(key);
  m.number = timeout_ms;
  return m;
}
Message add(std::string key, int64_t delta) {
  Message m = with(Command::kAdd);
  m.key = std::move(key);
  m.number = delta;
  return m;
}
Message wait(std::vector<std::string> keys, int64_t timeout_ms) {
  Message m = with(Command::kWait);
  m.keys = std::move(keys);
  m.number = timeout_ms;
  return m;
}
Message compare_set(std::string key, Bytes expected, Bytes desired) {
  Message m = with(Command::kCompareSet);
  m.key = std::move(key);
  m.value = std::move(expected);
  m.desired = std::move(desired);
  return m;
}
Message delete_key(std::string key) {
  Message m = with(Command::kDelete);
  m.key = std::move(key);
  return m;
}
Message check(std::vector<std::string> keys) {
  Message m = with(Command::kCheck);
  m.keys = std::move(keys);
  return m;
}
Message time() {
  return with(Command::kTime);
}
Message on_close(std::string key, Bytes value) {
  Message m = with(Command::kOnClose);
  m.key = std::move(key);
  m.value = std::move(value);
  return m;
}
Message replicate() {
  return with(Command::kReplicate);
}
Message ok() {
  return with(Command::kOk);
}
Message value(Bytes value) {
  Message m = with(Command::kValue);
  m.value = std::move(value);
  return m;
}
Message integer(int64_t number) {
  Message m = with(Command::kInt);
  m.number = number;
  return m;
}
Message timeout(std::vector<std::string> missing_keys) {
  Message m = with(Command::kTimeout);
  m.keys = std::move(missing_keys);
  return m;
}
Message error(std::string text) {
  Message m = with(Command::kError);
  m.text = std::move(text);
  return m;
}
}  // namespace msg

MessageParser::MessageParser(size_t max_message_bytes) {
  set_max_message_bytes(max_message_bytes);
}

void MessageParser::set_max_message_bytes(size_t bytes) {
  max_message_bytes_ = std::min(bytes, kMaxMessageBytes);
}

void MessageParser::reset() {
  buffer_.clear();
  offset_ = 0;
  error_.clear();
}

void MessageParser::feed(const uint8_t* data, size_t bytes) {
  if (!error_.empty() || bytes == 0) return;  // a poisoned parser keeps nothing
  // Drop consumed bytes before growing, so the buffer stays about one frame long.
  if (offset_ > 0 && (offset_ == buffer_.size() || offset_ >= buffer_.size() / 2)) {
    buffer_.erase(buffer_.begin(), buffer_.begin() + static_cast<std::ptrdiff_t>(offset_));
    offset_ = 0;
  }
  buffer_.insert(buffer_.end(), data, data + bytes);
}

void MessageParser::fail(std::string error) {
  error_ = std::move(error);
  buffer_.clear();
  buffer_.shrink_to_fit();
  offset_ = 0;
  throw ProtocolError(error_);
}

std::optional<Message> MessageParser::next() {
  if (!error_.empty()) throw ProtocolError(error_);
  if (buffered_bytes() < kFrameHeaderBytes) return std::nullopt;
  const size_t body = get_u32(buffer_.data() + offset_);
  if (body > max_message_bytes_) {
    fail(fmt::format("oversized store message: {} bytes announced, the limit is {} bytes{}", body,
                     max_message_bytes_,
                     max_message_bytes_ < kMaxMessageBytes ? " before HELLO" : " (64 MiB)"));
  }
  if (buffered_bytes() < kFrameHeaderBytes + body) return std::nullopt;
  const uint8_t* start = buffer_.data() + offset_ + kFrameHeaderBytes;
  try {
    Message message = decode_body(start, body);
    offset_ += kFrameHeaderBytes + body;
    if (offset_ == buffer_.size()) {
      buffer_.clear();
      offset_ = 0;
    }
    return message;
  } catch (const ProtocolError& e) {
    fail(e.what());
  }
}

}  // namespace ddp
