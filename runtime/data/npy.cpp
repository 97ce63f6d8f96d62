#include "runtime/data/npy.h"

#include "runtime/error.h"

#include <zlib.h>
#include "runtime/fmt.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

namespace ddp {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = 6;

std::vector<uint8_t> read_file(const std::string& path, std::string_view what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto status = fs::status(path, ec);
  DDP_CHECK(fs::exists(status), "{}: file not found (expected {})", path, what);
  DDP_CHECK(!fs::is_directory(status), "{}: is a directory, expected {}", path, what);
  std::ifstream in(path, std::ios::binary);
  DDP_CHECK(in.good(), "{}: cannot open: {}", path, std::strerror(errno));
  std::vector<uint8_t> bytes(fs::file_size(path, ec));
  in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  DDP_CHECK(in.gcount() == static_cast<std::streamsize>(bytes.size()), "{}: read {} of {} bytes",
            path, in.gcount(), bytes.size());
  return bytes;
}

uint32_t le32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}
uint16_t le16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | p[1] << 8);
}

// The header dict, parsed as far as np.save writes it: string keys, a string, a
// bool and a tuple of integers as values.
struct Header {
  std::string descr;
  bool fortran_order = false;
  Shape shape;
};

class DictParser {
 public:
  DictParser(std::string_view text, const std::string& name, size_t offset)
      : text_(text), name_(name), offset_(offset) {}

  Header parse() {
    Header h;
    bool have_descr = false, have_order = false, have_shape = false;
    expect('{');
    while (true) {
      skip_space();
      if (peek() == '}') break;
      const std::string key = string_literal();
      expect(':');
      if (key == "descr") {
        h.descr = string_literal();
        have_descr = true;
      } else if (key == "fortran_order") {
        h.fortran_order = boolean();
        have_order = true;
      } else if (key == "shape") {
        h.shape = tuple();
        have_shape = true;
      } else {
        fail(fmt::format("a key 'descr', 'fortran_order' or 'shape', found '{}'", key));
      }
      skip_space();
      if (peek() == ',') ++pos_;
    }
    if (!have_descr || !have_order || !have_shape) {
      fail(fmt::format("the keys 'descr', 'fortran_order' and 'shape'; {} missing",
                       !have_descr   ? "'descr' is"
                       : !have_order ? "'fortran_order' is"
                                     : "'shape' is"));
    }
    return h;
  }

 private:
  [[noreturn]] void fail(const std::string& expected) const {
    const size_t end = text_.find_last_not_of(" \n");
    throw ValueError(fmt::format("{}: malformed .npy header at byte {}: expected {} in {}", name_,
                                 offset_ + pos_, expected,
                                 text_.substr(0, end == std::string_view::npos ? 0 : end + 1)));
  }
  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\n')) ++pos_;
  }
  void expect(char c) {
    skip_space();
    if (peek() != c) fail(fmt::format("'{}'", c));
    ++pos_;
  }
  std::string string_literal() {
    skip_space();
    const char quote = peek();
    if (quote != '\'' && quote != '"') fail("a quoted string");
    const size_t end = text_.find(quote, pos_ + 1);
    if (end == std::string_view::npos) fail("a closing quote");
    std::string s(text_.substr(pos_ + 1, end - pos_ - 1));
    pos_ = end + 1;
    return s;
  }
  bool boolean() {
    skip_space();
    if (text_.substr(pos_, 4) == "True") {
      pos_ += 4;
      return true;
    }
    if (text_.substr(pos_, 5) == "False") {
      pos_ += 5;
      return false;
    }
    fail("True or False");
  }
  Shape tuple() {
    expect('(');
    Shape shape;
    while (true) {
      skip_space();
      if (peek() == ')') break;
      const size_t start = pos_;
      int64_t v = 0;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
        if (v > (std::numeric_limits<int64_t>::max() - 9) / 10) fail("a dimension below 2^63");
        v = v * 10 + (text_[pos_++] - '0');
      }
      if (pos_ == start) fail("a dimension (a non-negative integer)");
      shape.push_back(v);
      skip_space();
      if (peek() == 'L') ++pos_;  // Python 2's long suffix
      skip_space();
      if (peek() == ',') ++pos_;
    }
    ++pos_;
    return shape;
  }

  std::string_view text_;
  const std::string& name_;
  size_t offset_;
  size_t pos_ = 0;
};

// How one NumPy dtype is read: its item size and the runtime dtype it becomes.
struct Conversion {
  DType to;
  size_t item;  // bytes per element in the file
  char kind;    // 'f' float, 'i' signed, 'u' unsigned, 'b' bool
  bool swap;    // big-endian in the file
};

Conversion conversion_for(const std::string& descr, const std::string& name) {
  const auto refuse = [&](std::string_view why) {
    throw ValueError(fmt::format("{}: dtype '{}' is not read: {}", name, descr, why));
  };
  if (descr.size() < 3) refuse("expected a NumPy type string such as '<f4'");
  const char order = descr[0], kind = descr[1];
  const std::string size_text = descr.substr(2);
  size_t item = 0;
  for (char c : size_text) {
    if (c < '0' || c > '9') refuse("expected a NumPy type string such as '<f4'");
    item = item * 10 + static_cast<size_t>(c - '0');
  }
  if (order != '<' && order != '>' && order != '|' && order != '=') {
    refuse("expected a byte order '<', '>', '|' or '='");
  }
  const bool swap = order == '>' && item > 1;
  const auto fits = [&](DType to) { return Conversion{to, item, kind, swap}; };
  switch (kind) {
    case 'f':
      if (item == 4) return fits(DType::f32);
      if (item == 2) return fits(DType::f16);
      if (item == 8) return fits(DType::f32);  // Note [npy dtypes]: rounded to f32
      break;
    case 'i':
      if (item == 4) return fits(DType::i32);
      if (item == 8) return fits(DType::i64);
      if (item == 1 || item == 2) return fits(DType::i64);
      break;
    case 'u':
      if (item == 1) return fits(DType::u8);
      if (item == 2 || item == 4) return fits(DType::i64);
      if (item == 8) refuse("uint64 values may not fit int64; convert with a.astype(np.int64)");
      break;
    case 'b':
      if (item == 1) return fits(DType::u8);
      break;
    case 'c':
      refuse("complex arrays have no ddp dtype; save a.real and a.imag");
      break;
    case 'U':
    case 'S':
    case 'O':
      refuse("strings and objects are not numbers; encode them as integers first");
      break;
    default:
      break;
  }
  refuse("expected float16/32/64, int8/16/32/64, uint8/16/32 or bool");
  return {};
}

// Element i of `src` (item bytes each), byte-swapped if needed, as raw bits.
uint64_t load_bits(const uint8_t* src, size_t item, bool swap) {
  uint64_t v = 0;
  for (size_t b = 0; b < item; ++b) {
    const size_t from = swap ? item - 1 - b : b;
    v |= uint64_t{src[from]} << (8 * b);
  }
  return v;
}

// `name` names the array in an error: a float64 past float32's range (which would
// read as inf, silently) is refused, as the CSV reader refuses it.
void convert(const uint8_t* src, int64_t n, const Conversion& c, Tensor& out,
             const std::string& name) {
  const auto count = static_cast<size_t>(n);
  if (!c.swap && element_size(out.dtype()) == c.item && (c.kind != 'b')) {
    std::memcpy(out.data_ptr(), src, count * c.item);
    return;
  }
  for (size_t i = 0; i < count; ++i) {
    const uint64_t bits = load_bits(src + i * c.item, c.item, c.swap);
    switch (out.dtype()) {
      case DType::f32: {
        float f;
        if (c.item == 8) {
          const double d = std::bit_cast<double>(bits);
          DDP_CHECK(!std::isfinite(d) || std::fabs(d) <= std::numeric_limits<float>::max(),
                    "{}: element {} is {}, past float32's range (about 3.4e38): scale the array "
                    "first",
                    name, i, d);
          f = static_cast<float>(d);
        } else {
          f = std::bit_cast<float>(static_cast<uint32_t>(bits));
        }
        out.data<float>()[i] = f;
        break;
      }
      case DType::f16:
        reinterpret_cast<uint16_t*>(out.data_ptr())[i] = static_cast<uint16_t>(bits);
        break;
      case DType::i32:
        out.data<int32_t>()[i] = static_cast<int32_t>(static_cast<uint32_t>(bits));
        break;
      case DType::i64: {
        int64_t v;
        if (c.kind == 'u') {
          v = static_cast<int64_t>(bits);
        } else {  // sign-extend from c.item bytes
          const unsigned shift = static_cast<unsigned>(64 - 8 * c.item);
          v = static_cast<int64_t>(bits << shift) >> shift;
        }
        out.data<int64_t>()[i] = v;
        break;
      }
      case DType::u8:
        out.data<uint8_t>()[i] = c.kind == 'b' ? (bits != 0 ? 1 : 0) : static_cast<uint8_t>(bits);
        break;
      case DType::bf16:
        break;  // never a conversion target
    }
  }
}

}  // namespace

Tensor parse_npy(std::span<const uint8_t> bytes, const std::string& name) {
  DDP_CHECK(bytes.size() >= kMagicSize + 4 && std::memcmp(bytes.data(), kMagic, kMagicSize) == 0,
            "{}: not a .npy file: expected the magic \\x93NUMPY at byte 0 ({} bytes in all)", name,
            bytes.size());
  const uint8_t major = bytes[6];
  DDP_CHECK(major >= 1 && major <= 3,
            "{}: .npy version {}.{} at byte 6: expected 1.0, 2.0 or 3.0 (np.save's)", name, major,
            bytes[7]);
  size_t at = 8;
  size_t header_size = 0;
  if (major == 1) {
    header_size = le16(bytes.data() + at);
    at += 2;
  } else {
    DDP_CHECK(bytes.size() >= at + 4, "{}: truncated at byte {}: expected a 4-byte header length",
              name, bytes.size());
    header_size = le32(bytes.data() + at);
    at += 4;
  }
  DDP_CHECK(bytes.size() >= at + header_size,
            "{}: truncated at byte {}: the header says it is {} bytes long, ending at byte {}",
            name, bytes.size(), header_size, at + header_size);
  const std::string_view text(reinterpret_cast<const char*>(bytes.data() + at), header_size);
  const Header h = DictParser(text, name, at).parse();
  at += header_size;

  DDP_CHECK(!h.fortran_order,
            "{}: fortran_order is True (a column-major array): save it in C order, "
            "np.save(path, np.ascontiguousarray(a))",
            name);
  const Conversion c = conversion_for(h.descr, name);
  const int64_t n = shape_numel(h.shape);
  size_t body = 0;
  // A count whose bytes wrap around 2^64 (2^62 '<f4') must not pass for an empty body.
  DDP_CHECK(!__builtin_mul_overflow(static_cast<size_t>(n), c.item, &body),
            "{}: shape {} of '{}' has more bytes than a 64-bit size holds", name,
            shape_str(h.shape), h.descr);
  DDP_CHECK(bytes.size() - at == body,
            "{}: {} at byte {}: shape {} of '{}' needs {} bytes of data after the {}-byte header, "
            "the file has {}",
            name, bytes.size() - at < body ? "truncated" : "trailing bytes",
            at + std::min(body, bytes.size() - at), shape_str(h.shape), h.descr, body, at,
            bytes.size() - at);
  Tensor out = empty(h.shape, {.dtype = c.to});
  convert(bytes.data() + at, n, c, out, name);
  return out;
}

Tensor read_npy(const std::string& path) {
  const auto bytes = read_file(path, "a NumPy .npy file");
  return parse_npy(bytes, path);
}

namespace {

constexpr uint32_t kEndOfCentralDirectory = 0x06054b50;
constexpr uint32_t kCentralEntry = 0x02014b50;
constexpr uint32_t kLocalEntry = 0x04034b50;

std::vector<uint8_t> inflate_member(std::span<const uint8_t> packed, size_t size,
                                    const std::string& name) {
  std::vector<uint8_t> out(size);
  z_stream z{};
  DDP_CHECK(inflateInit2(&z, -MAX_WBITS) == Z_OK, "{}: zlib: cannot start inflating", name);
  z.next_in = const_cast<Bytef*>(packed.data());
  z.avail_in = static_cast<uInt>(packed.size());
  z.next_out = out.data();
  z.avail_out = static_cast<uInt>(out.size());
  const int r = inflate(&z, Z_FINISH);
  const std::string message = z.msg != nullptr ? z.msg : "";
  const size_t produced = z.total_out;
  inflateEnd(&z);
  DDP_CHECK(r == Z_STREAM_END && produced == size,
            "{}: corrupt deflate stream: {} (inflated {} of the {} bytes the archive lists)", name,
            message.empty() ? "ended early" : message, produced, size);
  return out;
}

}  // namespace

std::map<std::string, Tensor> read_npz(const std::string& path) {
  const auto bytes = read_file(path, "a NumPy .npz archive");
  const size_t size = bytes.size();
  // The end-of-central-directory record: 22 bytes and a comment of up to 64 KiB.
  size_t eocd = std::string::npos;
  for (size_t back = 22; back <= std::min<size_t>(size, 22 + 65535); ++back) {
    if (le32(bytes.data() + size - back) == kEndOfCentralDirectory) {
      eocd = size - back;
      break;
    }
  }
  DDP_CHECK(eocd != std::string::npos,
            "{}: not a ZIP archive (.npz): no end-of-central-directory record in its last bytes "
            "({} bytes in all)",
            path, size);
  const size_t count = le16(bytes.data() + eocd + 10);
  const size_t dir_offset = le32(bytes.data() + eocd + 16);
  DDP_CHECK(count != 0xFFFF && dir_offset != 0xFFFFFFFF,
            "{}: a ZIP64 archive (over 4 GiB or 65535 members) is not read: save the arrays as "
            ".npy files in a directory instead",
            path);
  std::map<std::string, Tensor> arrays;
  size_t at = dir_offset;
  for (size_t i = 0; i < count; ++i) {
    DDP_CHECK(at + 46 <= eocd && le32(bytes.data() + at) == kCentralEntry,
              "{}: malformed ZIP central directory at byte {}: expected entry {} of {}", path, at,
              i + 1, count);
    const uint8_t* e = bytes.data() + at;
    const uint16_t method = le16(e + 10);
    const uint32_t crc = le32(e + 16);
    const size_t packed = le32(e + 20), unpacked = le32(e + 24);
    const size_t name_len = le16(e + 28), extra_len = le16(e + 30), comment_len = le16(e + 32);
    const size_t local = le32(e + 42);
    DDP_CHECK(at + 46 + name_len <= eocd,
              "{}: ZIP entry at byte {} has its name past the directory", path, at);
    const std::string member(reinterpret_cast<const char*>(e + 46), name_len);
    at += 46 + name_len + extra_len + comment_len;
    const std::string where = fmt::format("{}: member '{}'", path, member);
    DDP_CHECK(packed != 0xFFFFFFFF && unpacked != 0xFFFFFFFF && local != 0xFFFFFFFF,
              "{}: a ZIP64 member is not read: save the arrays as .npy files in a directory",
              where);
    DDP_CHECK(local + 30 <= size && le32(bytes.data() + local) == kLocalEntry,
              "{}: expected a ZIP local header at byte {}", where, local);
    const size_t data_at =
        local + 30 + le16(bytes.data() + local + 26) + le16(bytes.data() + local + 28);
    DDP_CHECK(data_at + packed <= size, "{}: truncated: its {} bytes at byte {} pass the end ({})",
              where, packed, data_at, size);
    const std::span<const uint8_t> stored(bytes.data() + data_at, packed);
    std::vector<uint8_t> inflated;
    std::span<const uint8_t> content;
    if (method == 0) {
      DDP_CHECK(packed == unpacked, "{}: stored with {} bytes but listed as {}", where, packed,
                unpacked);
      content = stored;
    } else if (method == 8) {
      inflated = inflate_member(stored, unpacked, where);
      content = inflated;
    } else {
      throw ValueError(
          fmt::format("{}: ZIP compression method {} is not read: expected 0 (np.savez) or 8 "
                      "(np.savez_compressed)",
                      where, method));
    }
    const auto actual =
        static_cast<uint32_t>(crc32(0L, content.data(), static_cast<uInt>(content.size())));
    DDP_CHECK(actual == crc,
              "{}: CRC-32 mismatch (the archive lists {:08x}, the data has {:08x}): "
              "the file is corrupt",
              where, crc, actual);
    std::string key = member;
    if (key.size() > 4 && key.ends_with(".npy")) key.resize(key.size() - 4);
    arrays[key] = parse_npy(content, where);
  }
  return arrays;
}

void write_npy(const std::string& path, const Tensor& tensor) {
  DDP_CHECK(tensor.dtype() != DType::bf16,
            "write_npy {}: NumPy has no bfloat16; write tensor.to(DType::f32) instead", path);
  const Tensor t = tensor.cpu();
  const char* descr = "";
  switch (t.dtype()) {
    case DType::f32:
      descr = "<f4";
      break;
    case DType::f16:
      descr = "<f2";
      break;
    case DType::i32:
      descr = "<i4";
      break;
    case DType::i64:
      descr = "<i8";
      break;
    case DType::u8:
      descr = "|u1";
      break;
    case DType::bf16:
      break;
  }
  std::string shape;
  for (int64_t d : t.shape()) shape += fmt::format("{}, ", d);
  if (t.dim() > 1) shape.resize(shape.size() - 2);  // (3, 4); a 1-D shape keeps "(3,)"
  if (t.dim() == 1) shape.resize(shape.size() - 1);
  std::string header =
      fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}", descr, shape);
  // Pad with spaces so that magic + version + length + header + '\n' is a multiple of 64.
  const size_t total = kMagicSize + 2 + 2 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  DDP_CHECK(out.good(), "write_npy {}: cannot create: {}", path, std::strerror(errno));
  const uint8_t version[2] = {1, 0};
  const uint8_t length[2] = {static_cast<uint8_t>(header.size() & 0xFF),
                             static_cast<uint8_t>(header.size() >> 8)};
  out.write(kMagic, kMagicSize);
  out.write(reinterpret_cast<const char*>(version), 2);
  out.write(reinterpret_cast<const char*>(length), 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
  DDP_CHECK(out.good(), "write_npy {}: write failed: {}", path, std::strerror(errno));
}

}  // namespace ddp
