// Token streams for the language models: the bytes of a text (the Brown corpus,
// one token per byte) or token shards in the .bin form of llm.c and nanoGPT's
// data scripts, memory-mapped and read as one stream.
//
// Note [token shards]: a shard is a 1024-byte header of 256 little-endian
// int32 -- [0] the magic 20240520, [1] the version (1: uint16 tokens, as GPT-2's
// 50257 need; 2: uint32 tokens, for larger vocabularies), [2] the token count,
// the rest zero -- then the tokens, little-endian. `tokenize` writes them
// (docs/data.md); llm.c's dev/data scripts write the same form, so their
// fineweb/tinyshakespeare shards train here as they are. A file whose size,
// magic, version or count disagree gets a ValueError naming the file, the
// byte offset and what was expected there. Shards given together are one
// stream in the order given (sorted by name for a directory): windows read
// across a shard's end into the next, as nanoGPT's single train.bin would,
// since shards are cut between documents that follow each other anyway.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ddp {

inline constexpr int32_t kTokenShardMagic = 20240520;
inline constexpr int64_t kTokenShardHeaderBytes = 1024;

// Writes tokens as one shard: version 1 (uint16) when every token is below 65536,
// else version 2 (uint32). Negative tokens are an error naming the first.
void write_token_shard(const std::string& path, std::span<const int32_t> tokens);

// The shards of --data: FILE.bin alone, or DIR's *.bin files sorted by name,
// split into train and validation by name: a file whose name has "val" (or
// "valid", "validation", "eval") as one of its parts between '_', '-' and '.'
// (llm.c's fineweb_val_000000.bin, nanoGPT's val.bin, wiki.valid.bin) is
// validation, the others train (survival_train_000001.bin is a train shard). Throws ValueError when
// DIR has no .bin file or, unless `for_validation` (--test-data's shards), no train shard.
struct ShardFiles {
  std::vector<std::string> train;
  std::vector<std::string> validation;
};
ShardFiles find_token_shards(const std::string& path, bool for_validation = false);
// Whether a shard's file name marks it as validation (above).
bool is_validation_shard_name(const std::string& file_name);
// True for a path ending in .bin, or a directory holding a .bin file.
bool is_token_shard_data(const std::string& path);

class TokenStream {
 public:
  TokenStream() = default;
  // One token per byte of `bytes` (0..255); the stream owns its copy.
  static TokenStream from_bytes(std::string bytes);
  // The shards, memory-mapped (read-only) and checked (Note [token shards]).
  static TokenStream open_shards(const std::vector<std::string>& paths);
  // Tokens [first, first + count) of `whole`, sharing its storage.
  static TokenStream slice(const TokenStream& whole, int64_t first, int64_t count);

  int64_t size() const { return size_; }
  // The largest token (0 for an empty stream): the model's vocabulary must exceed it.
  int64_t max_token() const { return max_token_; }
  int64_t at(int64_t i) const;
  // out[k] = at(pos + k) for k < n; throws ValueError past the end, naming the sizes.
  void read(int64_t pos, int64_t n, int64_t* out) const;
  // "3 shards, 1200000 tokens" or "1048576 bytes".
  std::string describe() const;
  bool is_bytes() const { return bytes_; }

 private:
  struct Piece {
    const uint8_t* data = nullptr;
    int width = 1;      // bytes per token: 1, 2 or 4
    int64_t first = 0;  // the piece's first token in the stream
    int64_t count = 0;
  };
  std::vector<Piece> pieces_;
  std::vector<std::shared_ptr<const void>> storage_;  // mappings or the owned bytes
  int64_t size_ = 0;
  int64_t max_token_ = 0;
  bool bytes_ = false;
  int64_t shards_ = 0;
};

// The token stream's unigram entropy H(X) and bigram conditional entropy
// H(X[t+1] | X[t]) in bits per token, as byte_entropies (text_corpus.h) gives
// them per byte: the bars of counting tokens and token pairs.
struct TokenEntropy {
  double unigram_bits = 0;
  double bigram_bits = 0;
};
TokenEntropy token_entropies(const TokenStream& stream);

}  // namespace ddp
