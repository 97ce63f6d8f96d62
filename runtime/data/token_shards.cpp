#include "runtime/data/token_shards.h"

#include "runtime/error.h"
#include "runtime/unique_fd.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <unordered_map>

namespace ddp {
namespace {

int32_t load_i32(const uint8_t* p) {
  uint32_t v = 0;
  for (int k = 3; k >= 0; --k) v = (v << 8) | p[k];
  return static_cast<int32_t>(v);
}

int64_t token_at(const uint8_t* data, int width, int64_t i) {
  const uint8_t* p = data + i * width;
  if (width == 1) return p[0];
  if (width == 2) return p[0] | (p[1] << 8);
  return static_cast<int64_t>(static_cast<uint32_t>(load_i32(p)));
}

}  // namespace

void write_token_shard(const std::string& path, std::span<const int32_t> tokens) {
  DDP_CHECK(tokens.size() <= static_cast<size_t>(INT32_MAX),
            "write_token_shard({}): {} tokens; a shard holds at most {} (its count is an int32): "
            "write several shards",
            path, tokens.size(), INT32_MAX);
  int32_t largest = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    DDP_CHECK(tokens[i] >= 0, "write_token_shard({}): token {} at position {} is negative", path,
              tokens[i], i);
    largest = std::max(largest, tokens[i]);
  }
  const int width = largest < 65536 ? 2 : 4;
  std::vector<uint8_t> bytes(static_cast<size_t>(kTokenShardHeaderBytes) + tokens.size() * width,
                             0);
  auto store = [&](size_t at, uint32_t v, int n) {
    for (int k = 0; k < n; ++k) bytes[at + k] = static_cast<uint8_t>(v >> (8 * k));
  };
  store(0, kTokenShardMagic, 4);
  store(4, width == 2 ? 1 : 2, 4);
  store(8, static_cast<uint32_t>(tokens.size()), 4);
  for (size_t i = 0; i < tokens.size(); ++i) {
    store(kTokenShardHeaderBytes + i * width, static_cast<uint32_t>(tokens[i]), width);
  }
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  DDP_CHECK(out.good(), "write_token_shard: cannot write {}: {}", path, std::strerror(errno));
}

bool is_token_shard_data(const std::string& path) {
  if (path.ends_with(".bin")) return true;
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) return false;
  for (const auto& entry : std::filesystem::directory_iterator(path, ec)) {
    if (entry.path().extension() == ".bin") return true;
  }
  return false;
}

bool is_validation_shard_name(const std::string& file_name) {
  std::string stem = file_name;
  if (stem.ends_with(".bin")) stem.resize(stem.size() - 4);
  size_t at = 0;
  while (at <= stem.size()) {
    const size_t end = std::min(stem.find_first_of("_-.", at), stem.size());
    std::string part = stem.substr(at, end - at);
    std::transform(part.begin(), part.end(), part.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (part == "val" || part == "valid" || part == "validation" || part == "eval") return true;
    at = end + 1;
  }
  return false;
}

ShardFiles find_token_shards(const std::string& path, bool for_validation) {
  ShardFiles files;
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) {
    DDP_CHECK(std::filesystem::exists(path, ec),
              "token shards: {} does not exist; pass a .bin shard or a directory of them "
              "(write them with `tokenize`, docs/data.md)",
              path);
    files.train.push_back(path);
    return files;
  }
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(path, ec)) {
    if (entry.path().extension() == ".bin") names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    const std::string full = (std::filesystem::path(path) / name).string();
    (is_validation_shard_name(name) ? files.validation : files.train).push_back(full);
  }
  DDP_CHECK(!names.empty(), "token shards: directory {} holds no .bin file", path);
  DDP_CHECK(for_validation || !files.train.empty(),
            "token shards: every .bin file in {} is a validation shard (\"val\", \"valid\", "
            "\"validation\" or \"eval\" is a part of its name): {}; a train shard is needed "
            "too (or pass these as --test-data)",
            path, fmt::join(names, ", "));
  return files;
}

TokenStream TokenStream::from_bytes(std::string bytes) {
  auto owned = std::make_shared<const std::string>(std::move(bytes));
  TokenStream s;
  s.bytes_ = true;
  s.size_ = static_cast<int64_t>(owned->size());
  s.pieces_.push_back({reinterpret_cast<const uint8_t*>(owned->data()), 1, 0, s.size_});
  for (unsigned char c : *owned) s.max_token_ = std::max<int64_t>(s.max_token_, c);
  s.storage_.push_back(owned);
  return s;
}

TokenStream TokenStream::open_shards(const std::vector<std::string>& paths) {
  TokenStream s;
  for (const std::string& path : paths) {
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    DDP_CHECK(fd, "token shard {}: cannot open it: {}", path, std::strerror(errno));
    struct stat st {};
    DDP_CHECK(::fstat(fd.get(), &st) == 0, "token shard {}: cannot stat it: {}", path,
              std::strerror(errno));
    const auto file_bytes = static_cast<int64_t>(st.st_size);
    DDP_CHECK(file_bytes >= kTokenShardHeaderBytes,
              "token shard {}: {} bytes, but a shard starts with a {}-byte header (256 int32: "
              "magic {}, version, token count); is it a token shard (written by `tokenize`)?",
              path, file_bytes, kTokenShardHeaderBytes, kTokenShardMagic);
    void* map =
        ::mmap(nullptr, static_cast<size_t>(file_bytes), PROT_READ, MAP_PRIVATE, fd.get(), 0);
    DDP_CHECK(map != MAP_FAILED, "token shard {}: cannot map its {} bytes: {}", path, file_bytes,
              std::strerror(errno));
    std::shared_ptr<const void> mapping(map, [file_bytes](const void* p) {
      ::munmap(const_cast<void*>(p), static_cast<size_t>(file_bytes));
    });
    const auto* bytes = static_cast<const uint8_t*>(map);
    const int32_t magic = load_i32(bytes), version = load_i32(bytes + 4),
                  count = load_i32(bytes + 8);
    DDP_CHECK(magic == kTokenShardMagic,
              "token shard {}: offset 0 holds {}, expected the magic {} (llm.c's .bin header); "
              "is it a token shard?",
              path, magic, kTokenShardMagic);
    DDP_CHECK(version == 1 || version == 2,
              "token shard {}: offset 4 holds version {}, expected 1 (uint16 tokens) or 2 (uint32)",
              path, version);
    const int width = version == 1 ? 2 : 4;
    DDP_CHECK(count >= 0 && file_bytes - kTokenShardHeaderBytes == int64_t{count} * width,
              "token shard {}: the header (offset 8) counts {} tokens of {} bytes, which need {} "
              "bytes after the {}-byte header, but the file has {}; a truncated or padded copy?",
              path, count, width, int64_t{count} * width, kTokenShardHeaderBytes,
              file_bytes - kTokenShardHeaderBytes);
    const uint8_t* data = bytes + kTokenShardHeaderBytes;
    for (int64_t i = 0; i < count; ++i)
      s.max_token_ = std::max(s.max_token_, token_at(data, width, i));
    if (count > 0) s.pieces_.push_back({data, width, s.size_, count});
    s.size_ += count;
    s.storage_.push_back(std::move(mapping));
    ++s.shards_;
  }
  return s;
}

TokenStream TokenStream::slice(const TokenStream& whole, int64_t first, int64_t count) {
  DDP_CHECK(first >= 0 && count >= 0 && first + count <= whole.size_,
            "TokenStream::slice: tokens [{}, {}) of a stream of {}", first, first + count,
            whole.size_);
  TokenStream s;
  s.bytes_ = whole.bytes_;
  s.storage_ = whole.storage_;
  s.shards_ = whole.shards_;
  for (const Piece& p : whole.pieces_) {
    const int64_t lo = std::max(first, p.first), hi = std::min(first + count, p.first + p.count);
    if (lo >= hi) continue;
    s.pieces_.push_back({p.data + (lo - p.first) * p.width, p.width, lo - first, hi - lo});
    for (int64_t i = lo - p.first; i < hi - p.first; ++i) {
      s.max_token_ = std::max(s.max_token_, token_at(p.data, p.width, i));
    }
  }
  s.size_ = count;
  return s;
}

int64_t TokenStream::at(int64_t i) const {
  int64_t v = 0;
  read(i, 1, &v);
  return v;
}

void TokenStream::read(int64_t pos, int64_t n, int64_t* out) const {
  DDP_CHECK(pos >= 0 && n >= 0 && pos + n <= size_,
            "TokenStream: tokens [{}, {}) asked of a stream of {} tokens", pos, pos + n, size_);
  // The piece holding pos: the last whose first <= pos.
  auto it = std::upper_bound(pieces_.begin(), pieces_.end(), pos,
                             [](int64_t v, const Piece& p) { return v < p.first; });
  size_t k = static_cast<size_t>(it - pieces_.begin()) - 1;
  while (n > 0) {
    const Piece& p = pieces_[k];
    const int64_t from = pos - p.first, take = std::min(n, p.count - from);
    for (int64_t i = 0; i < take; ++i) out[i] = token_at(p.data, p.width, from + i);
    out += take;
    pos += take;
    n -= take;
    ++k;
  }
}

TokenEntropy token_entropies(const TokenStream& stream) {
  TokenEntropy out;
  const int64_t n = stream.size();
  if (n == 0) return out;
  auto bits = [](const auto& counts, double total) {
    double h = 0;
    for (const auto& [key, c] : counts) h -= c / total * std::log2(c / total);
    return h;
  };
  std::unordered_map<int64_t, double> unigram, first;
  std::unordered_map<uint64_t, double> pairs;
  constexpr int64_t kChunk = 1 << 16;
  std::vector<int64_t> tokens(static_cast<size_t>(kChunk));
  int64_t prev = -1;
  for (int64_t pos = 0; pos < n; pos += kChunk) {
    const int64_t take = std::min(kChunk, n - pos);
    stream.read(pos, take, tokens.data());
    for (int64_t i = 0; i < take; ++i) {
      const int64_t t = tokens[static_cast<size_t>(i)];
      unigram[t] += 1;
      if (prev >= 0) {
        pairs[(static_cast<uint64_t>(prev) << 32) | static_cast<uint64_t>(t)] += 1;
        first[prev] += 1;
      }
      prev = t;
    }
  }
  out.unigram_bits = bits(unigram, static_cast<double>(n));
  if (n >= 2) {
    const auto m = static_cast<double>(n - 1);
    out.bigram_bits = bits(pairs, m) - bits(first, m);
  }
  return out;
}

std::string TokenStream::describe() const {
  if (bytes_) return fmt::format("{} bytes", size_);
  return fmt::format("{} shard{}, {} tokens", shards_, shards_ == 1 ? "" : "s", size_);
}

}  // namespace ddp
