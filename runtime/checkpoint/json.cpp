#include "runtime/checkpoint/json.h"

#include "runtime/error.h"

#include <unordered_set>

namespace ddp::json {
namespace {

constexpr int kMaxDepth = 64;

Value make_value(Value::Kind kind) {
  Value v;
  v.kind = kind;
  return v;
}

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  Value document() {
    Value v = value(0);
    skip_space();
    if (pos_ != text_.size()) fail("expected the end of the document");
    return v;
  }

 private:
  [[noreturn]] void fail(std::string_view what) const {
    const std::string found =
        pos_ < text_.size() ? fmt::format("'{}'", text_[pos_]) : std::string("the end");
    throw ValueError(fmt::format("at byte {}: {}, found {}", pos_, what, found));
  }
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool eat(char c) {
    skip_space();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  void expect(char c, std::string_view what) {
    if (!eat(c)) fail(what);
  }

  Value value(int depth) {
    if (depth > kMaxDepth) fail("nesting deeper than 64 levels");
    skip_space();
    if (pos_ >= text_.size()) fail("expected a value");
    const char c = text_[pos_];
    if (c == '{') return object(depth);
    if (c == '[') return array(depth);
    if (c == '"') {
      Value v = make_value(Value::Kind::string);
      v.string = string();
      return v;
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
      Value v = make_value(Value::Kind::integer);
      v.integer = integer();
      return v;
    }
    fail("expected an object, array, string or integer");
  }

  Value object(int depth) {
    Value v = make_value(Value::Kind::object);
    ++pos_;  // '{'
    if (eat('}')) return v;
    std::unordered_set<std::string> keys;  // a linear find made 50257 keys take 2.5 s
    do {
      skip_space();
      if (pos_ >= text_.size() || text_[pos_] != '"') fail("expected a key string");
      const size_t key_pos = pos_;
      std::string key = string();
      if (!keys.insert(key).second) {
        pos_ = key_pos;
        fail(fmt::format("duplicate key {}", quote(key)));
      }
      expect(':', "expected ':' after a key");
      v.object.emplace_back(std::move(key), value(depth + 1));
    } while (eat(','));
    expect('}', "expected ',' or '}' in an object");
    return v;
  }

  Value array(int depth) {
    Value v = make_value(Value::Kind::array);
    ++pos_;  // '['
    if (eat(']')) return v;
    do {
      v.array.push_back(value(depth + 1));
    } while (eat(','));
    expect(']', "expected ',' or ']' in an array");
    return v;
  }

  int64_t integer() {
    const bool negative = text_[pos_] == '-';
    if (negative) ++pos_;
    if (pos_ >= text_.size() || text_[pos_] < '0' || text_[pos_] > '9') fail("expected a digit");
    if (text_[pos_] == '0' && pos_ + 1 < text_.size() && text_[pos_ + 1] >= '0' &&
        text_[pos_ + 1] <= '9') {
      fail("expected no leading zeros");
    }
    uint64_t magnitude = 0;
    const uint64_t limit = negative ? (uint64_t{1} << 63) : (uint64_t{1} << 63) - 1;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      const auto digit = static_cast<uint64_t>(text_[pos_] - '0');
      if (magnitude > (limit - digit) / 10) fail("expected an integer that fits in 64 bits");
      magnitude = magnitude * 10 + digit;
      ++pos_;
    }
    if (pos_ < text_.size() && (text_[pos_] == '.' || text_[pos_] == 'e' || text_[pos_] == 'E')) {
      fail("expected an integer (fractions and exponents are not used by safetensors)");
    }
    return negative ? static_cast<int64_t>(~magnitude + 1) : static_cast<int64_t>(magnitude);
  }

  uint32_t hex4() {
    if (pos_ + 4 > text_.size()) fail("expected 4 hex digits after \\u");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i, ++pos_) {
      const char c = text_[pos_];
      const int d = c >= '0' && c <= '9'   ? c - '0'
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10
                    : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                           : -1;
      if (d < 0) fail("expected a hex digit in \\uXXXX");
      v = v * 16 + static_cast<uint32_t>(d);
    }
    return v;
  }

  // After "\u": one code point, joining a surrogate pair.
  uint32_t code_point() {
    const uint32_t hi = hex4();
    if (hi >= 0xDC00 && hi <= 0xDFFF) fail("expected a high surrogate before a low one");
    if (hi < 0xD800 || hi > 0xDBFF) return hi;
    if (pos_ + 2 > text_.size() || text_[pos_] != '\\' || text_[pos_ + 1] != 'u') {
      fail("expected \\uXXXX (a low surrogate) after a high surrogate");
    }
    pos_ += 2;
    const uint32_t lo = hex4();
    if (lo < 0xDC00 || lo > 0xDFFF) fail("expected a low surrogate after a high surrogate");
    return 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00);
  }

  std::string string() {
    ++pos_;  // '"'
    std::string out;
    while (true) {
      if (pos_ >= text_.size()) fail("expected a closing '\"'");
      const char c = text_[pos_];
      if (c == '"') break;
      if (static_cast<unsigned char>(c) < 0x20)
        fail("expected no raw control character in a string");
      ++pos_;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= text_.size()) fail("expected an escape after '\\'");
      const char e = text_[pos_++];
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u':
          append_utf8(out, code_point());
          break;
        default:
          --pos_;
          fail("expected one of the escapes \\\" \\\\ \\/ \\b \\f \\n \\r \\t \\u");
      }
    }
    ++pos_;  // '"'
    return out;
  }

  std::string_view text_;
  size_t pos_ = 0;
};

}  // namespace

const Value* Value::find(std::string_view key) const {
  for (const auto& [k, v] : object) {
    if (k == key) return &v;
  }
  return nullptr;
}

std::string_view kind_name(Value::Kind kind) {
  switch (kind) {
    case Value::Kind::object:
      return "an object";
    case Value::Kind::array:
      return "an array";
    case Value::Kind::string:
      return "a string";
    case Value::Kind::integer:
      return "an integer";
  }
  return "?";
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

bool is_valid_utf8(std::string_view s) {
  constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};  // shortest form per length
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t extra = 0;
    uint32_t cp = c;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      extra = 1, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      extra = 2, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      extra = 3, cp = c & 0x07;
    } else {
      return false;
    }
    if (s.size() - i <= extra) return false;
    for (size_t k = 1; k <= extra; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (cp < kMin[extra] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += extra + 1;
  }
  return true;
}

Value parse(std::string_view text) {
  DDP_CHECK(is_valid_utf8(text), "the text is not valid UTF-8");
  return Parser(text).document();
}

std::string quote(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
        } else {
          out += c;
        }
    }
  }
  out += '"';
  return out;
}

}  // namespace ddp::json
