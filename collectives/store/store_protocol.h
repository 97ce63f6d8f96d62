// The TCP store's wire format. See docs/store.md for the full table.
//
// A message (frame) is
//   u32 little-endian length of what follows, then
//   u8  command, then the command's fields in a fixed order:
//       string/bytes: u32 little-endian length, then that many bytes
//       key list:     u32 little-endian count, then that many strings
//       i64:          8 bytes little-endian, two's complement
//
//   request      fields                         reply
//   HELLO        secret                         OK | ERROR
//   SET          key, value                     OK
//   GET          key, timeout_ms                VALUE | TIMEOUT(missing keys)
//   ADD          key, delta                     INT (the new value)
//   WAIT         keys, timeout_ms               OK | TIMEOUT(missing keys)
//   COMPARE_SET  key, expected, desired         VALUE (the value after the call)
//   DELETE       key                            INT (1 if the key existed, else 0)
//   CHECK        keys                           INT (1 if all keys exist, else 0)
//   TIME         (none)                         INT (the server's steady clock, ns;
//                                               Note [trace clocks] in runtime/trace/clock.h)
//   ON_CLOSE     key, value                     OK (the server sets key = value when
//                                               this connection closes: Note [on close])
//   REPLICATE    (none)                         a stream: SET for every key, OK, then
//                                               SET / DELETE for every later write
//                                               (Note [store backup] in tcp_store.h)
//   any request                                 ERROR(text) on failure
//
// Every frame is at most kMaxMessageBytes after its length field. The parser
// never buffers more than one frame plus the bytes fed since it was complete,
// and throws ProtocolError on anything malformed; it never trusts a length or
// count before checking it against the bytes the frame actually holds.
#pragma once

#include "collectives/store/store.h"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ddp {

// Malformed bytes on a store connection: unknown command, truncated or
// oversized field, bytes left over inside a frame.
class ProtocolError : public StoreError {
  using StoreError::StoreError;
};

enum class Command : uint8_t {
  kHello = 1,
  kSet = 2,
  kGet = 3,
  kAdd = 4,
  kWait = 5,
  kCompareSet = 6,
  kDelete = 7,
  kCheck = 8,
  kTime = 9,
  kOnClose = 10,
  kReplicate = 11,
  kOk = 64,
  kValue = 65,
  kInt = 66,
  kTimeout = 67,
  kError = 68,
};

inline constexpr size_t kMaxMessageBytes = size_t{64} << 20;  // after the length field
inline constexpr size_t kFrameHeaderBytes = 4;
// The longest wait (GET, WAIT) the server keeps; clients cut longer ones to it.
inline constexpr int64_t kMaxTimeoutMs = int64_t{30} * 24 * 3600 * 1000;

// "GET", "COMPARE_SET", ...; "UNKNOWN" for a value outside the enum.
const char* command_name(Command command);
bool is_request(Command command);

// One decoded message. Which members a command uses is fixed by the table above;
// the others stay empty (and are ignored by encode()).
struct Message {
  Command command = Command::kOk;
  std::string key;                // SET GET ADD COMPARE_SET DELETE ON_CLOSE
  std::vector<std::string> keys;  // WAIT CHECK TIMEOUT
  Bytes value;                    // SET VALUE ON_CLOSE; COMPARE_SET: expected
  Bytes desired;                  // COMPARE_SET
  int64_t number = 0;             // GET WAIT: timeout in ms; ADD: delta; INT
  std::string text;               // HELLO: secret; ERROR: message

  bool operator==(const Message&) const = default;
};

// Builders for each command (the only fields a command carries are its arguments).
namespace msg {
Message hello(std::string secret);
Message set(std::string key, Bytes value);
Message get(std::string key, int64_t timeout_ms);
Message add(std::string key, int64_t delta);
Message wait(std::vector<std::string> keys, int64_t timeout_ms);
Message compare_set(std::string key, Bytes expected, Bytes desired);
Message delete_key(std::string key);
Message check(std::vector<std::string> keys);
Message time();
Message on_close(std::string key, Bytes value);
Message replicate();
Message ok();
Message value(Bytes value);
Message integer(int64_t number);
Message timeout(std::vector<std::string> missing_keys);
Message error(std::string text);
}  // namespace msg

// Appends one frame to `out`; throws ProtocolError (naming the command and the
// size) when the frame would exceed kMaxMessageBytes.
void encode(const Message& message, Bytes& out);
Bytes encode(const Message& message);

// Consumes a byte stream incrementally and yields complete messages.
//
//   parser.feed(data, bytes);
//   while (auto message = parser.next()) handle(*message);
//
// next() returns nullopt while a frame is incomplete and throws ProtocolError on
// malformed input; after an error the parser is poisoned: every later next()
// throws the same error (the stream cannot be resynchronised).
class MessageParser {
 public:
  explicit MessageParser(size_t max_message_bytes = kMaxMessageBytes);

  void feed(const uint8_t* data, size_t bytes);
  std::optional<Message> next();

  // Frames larger than this are rejected as soon as their length is seen
  // (before their bytes are buffered). At most kMaxMessageBytes.
  void set_max_message_bytes(size_t bytes);
  size_t buffered_bytes() const { return buffer_.size() - offset_; }
  void reset();

 private:
  [[noreturn]] void fail(std::string error);

  Bytes buffer_;
  size_t offset_ = 0;  // bytes of buffer_ already consumed
  size_t max_message_bytes_;
  std::string error_;
};

}  // namespace ddp
