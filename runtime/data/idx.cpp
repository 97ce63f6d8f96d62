#include "runtime/data/idx.h"

#include "runtime/error.h"

#include <zlib.h>
#include "runtime/fmt.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

namespace ddp {
namespace {

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

// A file opened through zlib: gzip streams are inflated, other files read as they are.
class IdxReader {
 public:
  explicit IdxReader(const std::string& path) : path_(path) {
    std::error_code ec;
    const auto status = std::filesystem::status(path, ec);
    DDP_CHECK(std::filesystem::exists(status), "{}: file not found", path);
    DDP_CHECK(!std::filesystem::is_directory(status), "{}: is a directory, expected an IDX file",
              path);
    errno = 0;
    file_.reset(gzopen(path.c_str(), "rb"));
    DDP_CHECK(file_ != nullptr, "{}: cannot open: {}", path,
              errno != 0 ? std::strerror(errno) : "out of memory");
  }

  // Reads up to n bytes; fewer only at the end of the data or when a gzip stream
  // ends early (remembered in gzip_note()). A corrupt stream throws.
  size_t read(uint8_t* dst, size_t n) {
    size_t got = 0;
    while (got < n) {
      const auto chunk = static_cast<unsigned>(std::min<size_t>(n - got, 1u << 30));
      const int r = gzread(file_.get(), dst + got, chunk);
      if (r <= 0) break;
      got += static_cast<size_t>(r);
    }
    if (got < n) check_stream();
    return got;
  }

  // Counts the bytes left (to report how long an oversized file is).
  size_t count_rest() {
    std::vector<uint8_t> buf(1 << 16);
    size_t total = 0;
    for (size_t r; (r = read(buf.data(), buf.size())) > 0;) total += r;
    return total;
  }

  // " (gzip: unexpected end of file)" when the stream ended early, else "".
  std::string gzip_note() const { return truncated_ ? " (gzip: unexpected end of file)" : ""; }

 private:
  // Z_BUF_ERROR is zlib's "unexpected end of file": a cut stream, reported by the
  // caller as truncation with the sizes. Any other error is a corrupt stream.
  void check_stream() {
    int errnum = Z_OK;
    const char* text = gzerror(file_.get(), &errnum);
    if (errnum == Z_BUF_ERROR) {
      truncated_ = true;
      return;
    }
    DDP_CHECK(errnum == Z_OK, "{}: corrupt gzip stream: {}", path_,
              errnum == Z_ERRNO ? std::strerror(errno) : strip_path(text));
  }
  // zlib prefixes its messages with the path.
  std::string strip_path(const char* text) const {
    const std::string s = text;
    const std::string prefix = path_ + ": ";
    return s.rfind(prefix, 0) == 0 ? s.substr(prefix.size()) : s;
  }

  std::string path_;
  GzFile file_;
  bool truncated_ = false;
};

uint32_t big_endian_u32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

std::string dims_str(const std::vector<int64_t>& dims) {
  return fmt::format("{}", fmt::join(dims, "x"));
}

// Reads and validates the magic number and the sizes.
std::vector<int64_t> read_header(IdxReader& reader, const std::string& path) {
  uint8_t magic[4];
  const size_t got = reader.read(magic, 4);
  DDP_CHECK(got == 4,
            "{}: truncated: an IDX file starts with a 4-byte magic number, file has {} bytes{}",
            path, got, reader.gzip_note());
  const uint32_t m = big_endian_u32(magic);
  DDP_CHECK(
      m == kIdxMagicImages || m == kIdxMagicLabels,
      "{}: not an IDX file of u8 images or labels: magic number is 0x{:08x}, expected "
      "0x{:08x} (images) or 0x{:08x} (labels){}",
      path, m, kIdxMagicImages, kIdxMagicLabels,
      (m >> 16) == 0 && ((m >> 8) & 0xff) != 0x08
          ? fmt::format("; data type 0x{:02x} is not supported, only 0x08 (u8)", (m >> 8) & 0xff)
          : std::string());
  const size_t ndim = m & 0xff;
  std::vector<uint8_t> sizes(4 * ndim);
  const size_t got_sizes = reader.read(sizes.data(), sizes.size());
  DDP_CHECK(got_sizes == sizes.size(),
            "{}: truncated: magic 0x{:08x} announces {} dimension sizes ({} bytes), file has {}{}",
            path, m, ndim, sizes.size(), got_sizes, reader.gzip_note());
  std::vector<int64_t> dims(ndim);
  for (size_t i = 0; i < ndim; ++i) dims[i] = big_endian_u32(&sizes[4 * i]);
  return dims;
}

}  // namespace

IdxArray read_idx(const std::string& path) {
  IdxReader reader(path);
  IdxArray out;
  out.dims = read_header(reader, path);
  const char* what = out.dims.size() == 3 ? "pixels" : "labels";
  uint64_t bytes = 1;
  for (int64_t d : out.dims) {
    DDP_CHECK(!__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes),
              "{}: header sizes {} overflow 64 bits", path, dims_str(out.dims));
  }
  DDP_CHECK(bytes <= (uint64_t{1} << 40), "{}: header says {} = {} bytes of {}, more than 1 TiB",
            path, dims_str(out.dims), bytes, what);
  out.data.resize(bytes);
  const size_t got = reader.read(out.data.data(), bytes);
  DDP_CHECK(got == bytes, "{}: truncated: header says {} = {} bytes of {}, file has {}{}", path,
            dims_str(out.dims), bytes, what, got, reader.gzip_note());
  const size_t extra = reader.count_rest();
  DDP_CHECK(extra == 0, "{}: too long: header says {} = {} bytes of {}, file has {} ({} extra)",
            path, dims_str(out.dims), bytes, what, bytes + extra, extra);
  return out;
}

}  // namespace ddp
