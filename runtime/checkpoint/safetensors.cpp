#include "runtime/checkpoint/safetensors.h"

#include "runtime/checkpoint/crc32c.h"
#include "runtime/checkpoint/json.h"
#include "runtime/error.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>

namespace ddp {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; ddp writes host memory as it is");

namespace {

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the limit of the reference implementation

// Note [checkpoint checksums]: save writes, for every tensor, the CRC-32C of its
// bytes into the metadata as "crc32c/<name>": "<8 hex digits>"; load recomputes
// it and names the tensor whose bytes changed. Metadata is the one place the
// format leaves for this, so the files stay plain safetensors (PyTorch and the
// safetensors library read them and ignore the keys). Files without the keys,
// such as PyTorch's, load unchecked. The keys are ddp's: a caller's metadata may
// not use the prefix, and load hands back the metadata without them. CRC-32C
// catches every burst error up to 32 bits and runs on SSE4.2's crc32
// instruction; it guards against damage (disk, copy, truncation into a valid
// layout, an edit), not against someone who recomputes it.
constexpr std::string_view kChecksumPrefix = "crc32c/";

std::string checksum_text(const Tensor& host) {
  return fmt::format("{:08x}", crc32c(host.data_ptr(), host.nbytes()));
}

struct DTypeName {
  DType dtype;
  std::string_view name;
};
constexpr DTypeName kDTypeNames[] = {{DType::f32, "F32"}, {DType::bf16, "BF16"},
                                     {DType::f16, "F16"}, {DType::i32, "I32"},
                                     {DType::i64, "I64"}, {DType::u8, "U8"}};

std::optional<DType> parse_dtype_name(std::string_view name) {
  for (const auto& d : kDTypeNames) {
    if (d.name == name) return d.dtype;
  }
  return std::nullopt;
}

void check_savable(const NamedTensors& tensors, const std::map<std::string, std::string>& metadata,
                   const std::string& path) {
  std::set<std::string_view> seen;
  for (const auto& [name, t] : tensors) {
    DDP_CHECK(name != "__metadata__",
              "save_safetensors {}: '__metadata__' is reserved, not a tensor name", path);
    DDP_CHECK(json::is_valid_utf8(name), "save_safetensors {}: tensor name {} is not valid UTF-8",
              path, json::quote(name));
    DDP_CHECK(seen.insert(name).second, "save_safetensors {}: tensor name '{}' appears twice", path,
              name);
    DDP_CHECK(t.defined(), "save_safetensors {}: tensor '{}' is undefined", path, name);
  }
  for (const auto& [key, value] : metadata) {
    DDP_CHECK(!key.starts_with(kChecksumPrefix),
              "save_safetensors {}: metadata key {} uses the prefix '{}', which ddp reserves for "
              "the tensors' checksums; rename the key",
              path, json::quote(key), kChecksumPrefix);
    DDP_CHECK(json::is_valid_utf8(key) && json::is_valid_utf8(value),
              "save_safetensors {}: metadata entry {} is not valid UTF-8", path, json::quote(key));
  }
}

// The JSON header, padded with spaces to a multiple of 8 bytes.
std::string build_header(const NamedTensors& tensors,
                         const std::map<std::string, std::string>& metadata) {
  std::string h = "{";
  if (!metadata.empty()) {
    h += "\"__metadata__\":{";
    for (auto it = metadata.begin(); it != metadata.end(); ++it) {
      if (it != metadata.begin()) h += ',';
      h += json::quote(it->first) + ':' + json::quote(it->second);
    }
    h += '}';
  }
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (h.size() > 1) h += ',';
    const uint64_t end = offset + t.nbytes();
    h += fmt::format("{}:{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
                     json::quote(name), safetensors_dtype_name(t.dtype()),
                     fmt::join(t.shape(), ","), offset, end);
    offset = end;
  }
  h += '}';
  h.append((8 - h.size() % 8) % 8, ' ');
  return h;
}

// Note [atomic checkpoint]: bytes go to `path.tmp.<pid>` (unique per process, so
// ranks saving to one directory do not collide), which is flushed and fsync'ed,
// then renamed over `path` (atomic within a file system), and the directory is
// fsync'ed so the rename survives a crash. Until commit() the destructor removes
// the temporary file, so a failure leaves the old `path` untouched.
class AtomicFile {
 public:
  explicit AtomicFile(const std::string& path)
      : path_(path), tmp_(fmt::format("{}.tmp.{}", path, ::getpid())) {
    file_ = std::fopen(tmp_.c_str(), "wb");
    if (file_ == nullptr) fail("creating", errno);
    created_ = true;
  }
  ~AtomicFile() {
    if (file_ != nullptr) std::fclose(file_);
    if (created_ && !committed_) std::remove(tmp_.c_str());
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t bytes) {
    if (bytes > 0 && std::fwrite(data, 1, bytes, file_) != bytes) fail("writing", errno);
  }
  // Overwrites bytes written earlier, then goes back to the end.
  void write_at(uint64_t offset, const void* data, size_t bytes) {
    if (::fseeko(file_, static_cast<off_t>(offset), SEEK_SET) != 0) fail("seeking in", errno);
    write(data, bytes);
    if (::fseeko(file_, 0, SEEK_END) != 0) fail("seeking in", errno);
  }

  void commit() {
    if (std::fflush(file_) != 0) fail("flushing", errno);
    if (::fsync(::fileno(file_)) != 0) fail("fsync of", errno);
    const int closed = std::fclose(file_);
    file_ = nullptr;
    if (closed != 0) fail("closing", errno);
    if (std::rename(tmp_.c_str(), path_.c_str()) != 0) fail("renaming", errno);
    committed_ = true;
    sync_directory();
  }

 private:
  [[noreturn]] void fail(std::string_view step, int err) const {
    throw ValueError(fmt::format("save_safetensors: cannot write '{}': {} '{}' failed: {}", path_,
                                 step, step == "renaming" ? tmp_ + "' to '" + path_ : tmp_,
                                 std::strerror(err)));
  }

  void sync_directory() const {
    std::string dir = std::filesystem::path(path_).parent_path().string();
    if (dir.empty()) dir = ".";
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
    int err = fd < 0 ? errno : 0;
    if (fd >= 0) {
      if (::fsync(fd) != 0) err = errno;
      ::close(fd);
    }
    // Some file systems cannot fsync a directory (EINVAL); the data itself is synced.
    DDP_CHECK(err == 0 || err == EINVAL,
              "save_safetensors: wrote '{}', but the fsync of its directory '{}' failed: {}", path_,
              dir, std::strerror(err));
  }

  std::string path_;
  std::string tmp_;
  FILE* file_ = nullptr;
  bool created_ = false;  // the temporary file is ours to remove
  bool committed_ = false;
};

// One tensor's entry of the header.
struct Entry {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

class ReadFile {
 public:
  explicit ReadFile(const std::string& path) : path_(path), file_(std::fopen(path.c_str(), "rb")) {
    DDP_CHECK(file_ != nullptr, "{}: cannot open the checkpoint: {}", path, std::strerror(errno));
    struct stat st {};
    DDP_CHECK(::fstat(::fileno(file_), &st) == 0, "{}: cannot stat: {}", path,
              std::strerror(errno));
    DDP_CHECK(!S_ISDIR(st.st_mode), "{}: is a directory, expected a .safetensors file", path);
    size_ = static_cast<uint64_t>(st.st_size);
  }
  ~ReadFile() { std::fclose(file_); }
  ReadFile(const ReadFile&) = delete;
  ReadFile& operator=(const ReadFile&) = delete;

  uint64_t size() const { return size_; }
  void read_at(uint64_t offset, void* dst, size_t bytes) {
    if (bytes == 0) return;
    DDP_CHECK(
        ::fseeko(file_, static_cast<off_t>(offset), SEEK_SET) == 0 &&
            std::fread(dst, 1, bytes, file_) == bytes,
        "{}: cannot read {} bytes at offset {}: {}", path_, bytes, offset,
        std::ferror(file_) ? std::strerror(errno) : "the file ended early (changed while read?)");
  }

 private:
  std::string path_;
  FILE* file_;
  uint64_t size_ = 0;
};

uint64_t non_negative(const json::Value& v, const std::string& path, const std::string& what) {
  DDP_CHECK(v.kind == json::Value::Kind::integer && v.integer >= 0,
            "{}: {} must be non-negative integers, found {}{}", path, what, json::kind_name(v.kind),
            v.kind == json::Value::Kind::integer ? fmt::format(" {}", v.integer) : std::string());
  return static_cast<uint64_t>(v.integer);
}

const json::Value& field(const json::Value& info, std::string_view key, json::Value::Kind kind,
                         const std::string& path, const std::string& name) {
  const json::Value* v = info.find(key);
  DDP_CHECK(v != nullptr, "{}: tensor '{}' has no \"{}\" in the header", path, name, key);
  DDP_CHECK(v->kind == kind, "{}: tensor '{}': \"{}\" must be {}, found {}", path, name, key,
            json::kind_name(kind), json::kind_name(v->kind));
  return *v;
}

Entry parse_entry(const std::string& name, const json::Value& info, const std::string& path) {
  using Kind = json::Value::Kind;
  DDP_CHECK(info.kind == Kind::object,
            "{}: tensor '{}': expected an object with dtype, shape and data_offsets, found {}",
            path, name, json::kind_name(info.kind));
  Entry e;
  e.name = name;
  const std::string& dtype = field(info, "dtype", Kind::string, path, name).string;
  const auto parsed = parse_dtype_name(dtype);
  DDP_CHECK(parsed.has_value(),
            "{}: tensor '{}' has dtype '{}', which is unknown or not supported by ddp (supported: "
            "F32, BF16, F16, I32, I64, U8){}",
            path, name, dtype,
            dtype == "F64" ? "; ddp has no float64: save it from PyTorch as float32 "
                             "(state_dict values .to(torch.float32))"
                           : "");
  e.dtype = *parsed;
  for (const json::Value& s : field(info, "shape", Kind::array, path, name).array) {
    e.shape.push_back(
        static_cast<int64_t>(non_negative(s, path, fmt::format("shape of '{}'", name))));
  }
  const auto& offsets = field(info, "data_offsets", Kind::array, path, name).array;
  DDP_CHECK(offsets.size() == 2,
            "{}: tensor '{}': data_offsets must be [begin, end], found {} numbers", path, name,
            offsets.size());
  const std::string what = fmt::format("data_offsets of '{}'", name);
  e.begin = non_negative(offsets[0], path, what);
  e.end = non_negative(offsets[1], path, what);
  return e;
}

std::map<std::string, std::string> parse_metadata(const json::Value& v, const std::string& path) {
  DDP_CHECK(v.kind == json::Value::Kind::object, "{}: __metadata__ must be a JSON object, found {}",
            path, json::kind_name(v.kind));
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : v.object) {
    DDP_CHECK(value.kind == json::Value::Kind::string,
              "{}: __metadata__ maps strings to strings, but '{}' is {}", path, key,
              json::kind_name(value.kind));
    out[key] = value.string;
  }
  return out;
}

// Each tensor's byte count must match its shape; together the tensors must tile
// the data section exactly (as the reference implementation requires).
void check_layout(std::vector<Entry>& entries, uint64_t data_bytes, const std::string& path) {
  for (const Entry& e : entries) {
    uint64_t bytes = element_size(e.dtype);
    for (int64_t s : e.shape) {
      DDP_CHECK(!__builtin_mul_overflow(bytes, static_cast<uint64_t>(s), &bytes),
                "{}: tensor '{}': shape {} is too large", path, e.name, shape_str(e.shape));
    }
    DDP_CHECK(e.begin <= e.end && e.end - e.begin == bytes,
              "{}: tensor '{}': data_offsets [{}, {}] do not match its shape: {} {} needs {} bytes",
              path, e.name, e.begin, e.end, safetensors_dtype_name(e.dtype), shape_str(e.shape),
              bytes);
    DDP_CHECK(
        e.end <= data_bytes,
        "{}: tensor '{}': data_offsets [{}, {}] are out of range: the data section has {} bytes",
        path, e.name, e.begin, e.end, data_bytes);
  }
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;
  const Entry* previous = nullptr;
  for (const Entry& e : entries) {
    DDP_CHECK(e.begin >= covered, "{}: tensors '{}' [{}, {}] and '{}' [{}, {}] overlap", path,
              previous->name, previous->begin, previous->end, e.name, e.begin, e.end);
    DDP_CHECK(e.begin == covered,
              "{}: bytes [{}, {}) of the data section belong to no tensor (before '{}')", path,
              covered, e.begin, e.name);
    covered = e.end;
    previous = &e;
  }
  DDP_CHECK(covered == data_bytes,
            "{}: the data section has {} bytes, but the tensors use {} ({} trailing bytes)", path,
            data_bytes, covered, data_bytes - covered);
}

// The header's bytes, checked against the file's size.
// Note [checkpoint checksums]: a file has a checksum for every tensor or for
// none; a damaged key must not turn a tensor's check off.
void check_checksum_keys(const std::map<std::string, std::string>& metadata,
                         const std::vector<Entry>& entries, const std::string& path) {
  std::set<std::string> names;
  for (const Entry& e : entries) names.insert(e.name);
  size_t keys = 0;
  for (const auto& [key, value] : metadata) {
    if (!key.starts_with(kChecksumPrefix)) continue;
    ++keys;
    const std::string name = key.substr(kChecksumPrefix.size());
    DDP_CHECK(names.contains(name),
              "{}: the metadata has a checksum for '{}', which is not a tensor of the file: the "
              "header was damaged or edited; restore the file or resume from an earlier one",
              path, name);
  }
  if (keys == 0) return;  // written without checksums (PyTorch, older ddp)
  for (const Entry& e : entries) {
    DDP_CHECK(metadata.contains(std::string(kChecksumPrefix) + e.name),
              "{}: tensor '{}' has no checksum while the file's other tensors do: the header was "
              "damaged or edited; restore the file or resume from an earlier one",
              path, e.name);
  }
}

void verify_checksum(const std::map<std::string, std::string>& metadata, const std::string& name,
                     const Tensor& t, const std::string& path) {
  const auto it = metadata.find(std::string(kChecksumPrefix) + name);
  if (it == metadata.end()) return;  // written without checksums (PyTorch, older ddp)
  const std::string actual = checksum_text(t);
  DDP_CHECK(it->second == actual,
            "{}: tensor '{}' is corrupted: its {} bytes have CRC-32C {}, but the file recorded "
            "{} when it was written. The file was damaged after it was saved (disk, copy, "
            "edit); restore it or resume from an earlier checkpoint",
            path, name, t.nbytes(), actual, it->second);
}

std::string read_header(ReadFile& file, const std::string& path) {
  DDP_CHECK(file.size() >= 8,
            "{}: the file has {} bytes, too short for a safetensors file (it starts with an 8-byte "
            "header length)",
            path, file.size());
  uint64_t header_bytes = 0;
  file.read_at(0, &header_bytes, 8);
  DDP_CHECK(header_bytes <= file.size() - 8,
            "{}: header length {} is beyond the end of the file ({} bytes); the file is truncated "
            "or not a safetensors file",
            path, header_bytes, file.size());
  DDP_CHECK(header_bytes <= kMaxHeaderBytes, "{}: header length {} is above the limit of {} bytes",
            path, header_bytes, kMaxHeaderBytes);
  std::string header(header_bytes, '\0');
  file.read_at(8, header.data(), header.size());
  return header;
}

}  // namespace

std::string_view safetensors_dtype_name(DType dtype) {
  for (const auto& d : kDTypeNames) {
    if (d.dtype == dtype) return d.name;
  }
  DDP_ASSERT(false, "dtype {} has no safetensors name", dtype_name(dtype));
}

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  check_savable(tensors, metadata, path);
  // The checksums are fixed-width, so the header is written with placeholders,
  // the tensors streamed (a GPU tensor copied to the host one at a time), and
  // the header written again with the real values: same length, same place.
  std::map<std::string, std::string> with_checksums = metadata;
  for (const auto& [name, t] : tensors) {
    with_checksums[std::string(kChecksumPrefix) + name] = std::string(8, '0');
  }
  const uint64_t header_bytes = build_header(tensors, with_checksums).size();
  AtomicFile file(path);
  file.write(&header_bytes, 8);  // little-endian host (static_assert above)
  file.write(build_header(tensors, with_checksums).data(), header_bytes);
  for (const auto& [name, t] : tensors) {
    const Tensor host = t.device().is_cpu() ? t : t.cpu();
    file.write(host.data_ptr(), host.nbytes());
    with_checksums[std::string(kChecksumPrefix) + name] = checksum_text(host);
  }
  const std::string header = build_header(tensors, with_checksums);
  DDP_ASSERT(header.size() == header_bytes, "checksums changed the header's length");
  file.write_at(8, header.data(), header.size());
  file.commit();
}

bool SafetensorsFile::contains(std::string_view name) const {
  return std::any_of(tensors.begin(), tensors.end(),
                     [&](const auto& p) { return p.first == name; });
}

const Tensor& SafetensorsFile::at(std::string_view name) const {
  for (const auto& [n, t] : tensors) {
    if (n == name) return t;
  }
  std::vector<std::string_view> names;
  for (const auto& p : tensors) names.push_back(p.first);
  throw ValueError(
      fmt::format("no tensor '{}' in the checkpoint; it has: {}", name,
                  names.empty() ? std::string("none") : fmt::format("{}", fmt::join(names, ", "))));
}

SafetensorsFile load_safetensors(const std::string& path) {
  ReadFile file(path);
  const std::string header = read_header(file, path);
  json::Value root;
  try {
    root = json::parse(header);
  } catch (const ValueError& e) {
    throw ValueError(fmt::format("{}: the header is not valid JSON: {}", path, e.what()));
  }
  DDP_CHECK(root.kind == json::Value::Kind::object,
            "{}: the header must be a JSON object, found {}", path, json::kind_name(root.kind));
  SafetensorsFile out;
  std::vector<Entry> entries;
  for (const auto& [name, value] : root.object) {
    if (name == "__metadata__") {
      out.metadata = parse_metadata(value, path);
    } else {
      entries.push_back(parse_entry(name, value, path));
    }
  }
  const uint64_t data_start = 8 + header.size();
  check_layout(entries, file.size() - data_start, path);
  check_checksum_keys(out.metadata, entries, path);
  for (const Entry& e : entries) {
    Tensor t = empty(e.shape, {.dtype = e.dtype});
    file.read_at(data_start + e.begin, t.data_ptr(), t.nbytes());
    verify_checksum(out.metadata, e.name, t, path);
    out.tensors.emplace_back(e.name, std::move(t));
  }
  std::erase_if(out.metadata, [](const auto& kv) { return kv.first.starts_with(kChecksumPrefix); });
  return out;
}

std::vector<TensorSpec> tensor_specs(const NamedTensors& tensors) {
  std::vector<TensorSpec> specs;
  for (const auto& [name, t] : tensors) specs.push_back({name, t.shape(), t.dtype()});
  return specs;
}

void check_state_dict_match(const std::vector<TensorSpec>& expected, const NamedTensors& loaded) {
  std::map<std::string_view, const Tensor*> by_name;
  for (const auto& [name, t] : loaded) by_name[name] = &t;
  std::vector<std::string> missing, unexpected, mismatched;
  std::set<std::string_view> expected_names;
  for (const TensorSpec& spec : expected) {
    expected_names.insert(spec.name);
    const auto it = by_name.find(spec.name);
    if (it == by_name.end()) {
      missing.push_back(json::quote(spec.name));
      continue;
    }
    const Tensor& t = *it->second;
    if (t.shape() != spec.shape) {
      mismatched.push_back(fmt::format(
          "size mismatch for {}: copying a param with shape {} from checkpoint, the shape in "
          "current model is {}.",
          spec.name, shape_str(t.shape()), shape_str(spec.shape)));
    } else if (t.dtype() != spec.dtype) {
      mismatched.push_back(
          fmt::format("dtype mismatch for {}: the checkpoint has {}, the current "
                      "model has {}.",
                      spec.name, dtype_name(t.dtype()), dtype_name(spec.dtype)));
    }
  }
  for (const auto& [name, t] : loaded) {
    if (!expected_names.contains(name)) unexpected.push_back(json::quote(name));
  }
  if (missing.empty() && unexpected.empty() && mismatched.empty()) return;
  std::string msg = "Error(s) in loading state_dict:";
  if (!missing.empty())
    msg += fmt::format("\n\tMissing key(s) in state_dict: {}.", fmt::join(missing, ", "));
  if (!unexpected.empty()) {
    msg += fmt::format("\n\tUnexpected key(s) in state_dict: {}.", fmt::join(unexpected, ", "));
  }
  for (const std::string& line : mismatched) msg += "\n\t" + line;
  throw ValueError(msg);
}

}  // namespace ddp
