// The little JSON that safetensors headers need: objects (key order kept),
// arrays, strings (with every escape, \uXXXX and surrogate pairs included) and
// integers. No floats, booleans or null: a header holding one is rejected.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ddp::json {

struct Value {
  enum class Kind { object, array, string, integer };
  Kind kind = Kind::object;
  std::string string;
  int64_t integer = 0;
  std::vector<Value> array;
  std::vector<std::pair<std::string, Value>> object;  // in text order, keys unique

  const Value* find(std::string_view key) const;  // null when absent (objects only)
};

std::string_view kind_name(Value::Kind kind);  // "an object", "an array", ...

// Parses a whole document. Throws ValueError "at byte N: <what was expected>" for
// invalid UTF-8, syntax errors, unsupported values, duplicate keys, integers
// beyond 64 bits or nesting deeper than 64.
Value parse(std::string_view text);

// `s` as a JSON string literal, quotes included ("a\"b\n" -> "\"a\\\"b\\n\"").
// Non-ASCII UTF-8 is kept as is; control characters become \uXXXX.
std::string quote(std::string_view s);

bool is_valid_utf8(std::string_view s);
// Appends code point `cp` (at most 0x10FFFF) as 1 to 4 bytes of UTF-8.
void append_utf8(std::string& out, uint32_t cp);

}  // namespace ddp::json
