// libFuzzer target for the store's wire-format parser (see README.md here).
//
// Properties checked on every input:
//   - the parser yields messages or throws ProtocolError, never anything else;
//   - it never buffers more than it was fed;
//   - every message it yields re-encodes to exactly the frame it came from.
// The first input byte picks the feed chunk size, so incremental parsing is
// exercised as well as whole buffers.
#include "collectives/store/store_protocol.h"

#include <cstddef>
#include <cstdint>
#include <cstdlib>

namespace {

void check(bool condition) {
  if (!condition) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t chunk = 1 + data[0] % 32;
  data += 1;
  size -= 1;
  ddp::MessageParser parser;
  ddp::Bytes consumed;  // the frames of every message yielded so far, re-encoded
  size_t fed = 0;
  try {
    while (fed < size) {
      const size_t n = size - fed < chunk ? size - fed : chunk;
      parser.feed(data + fed, n);
      fed += n;
      check(parser.buffered_bytes() <= fed);
      while (auto message = parser.next()) ddp::encode(*message, consumed);
    }
    // Re-encoding is canonical: the yielded frames are a prefix of the input.
    check(consumed.size() + parser.buffered_bytes() == size);
    for (size_t i = 0; i < consumed.size(); ++i) check(consumed[i] == data[i]);
  } catch (const ddp::ProtocolError&) {
    // Malformed input: the expected outcome for most random bytes.
  }
  return 0;
}
