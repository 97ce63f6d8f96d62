// GPT-2's BPE tokenizer (runtime/data/bpe.h): the Unicode classes, the
// pre-tokenizer on tricky text, BPE on a vocabulary small enough to work out by
// hand, and the installed vocabulary's known ids. The token-for-token comparison
// with Encoder.js on whole texts is tests/e2e/bpe_js.sh.
#include "runtime/data/bpe.h"
#include "runtime/checkpoint/json.h"
#include "runtime/error.h"
#include "tests/unit/error_text.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

namespace ddp {
namespace {

using namespace std::string_literals;
using Pieces = std::vector<std::string>;

// ---- Unicode classes -------------------------------------------------------

TEST(BpeUnicode, KnownCodePoints) {
  using C = CodePointClass;
  const std::vector<std::pair<char32_t, C>> cases = {
      {U'a', C::letter},   {U'Z', C::letter},    {U'0', C::number},    {U'9', C::number},
      {U'é', C::letter},   {U'λ', C::letter},    {U'Ω', C::letter},    {0x4E00, C::letter},
      {0x0663, C::number}, {0x00BD, C::number},  {0x2167, C::number},  {U' ', C::space},
      {U'\t', C::space},   {U'\n', C::space},    {U'\r', C::space},    {0x000B, C::space},
      {0x000C, C::space},  {0x2003, C::space},   {0x00A0, C::space},   {0xFEFF, C::space},
      {0x2028, C::space},  {0x3000, C::space},   {U'_', C::other},     {U'!', C::other},
      {U'\'', C::other},   {0x0085, C::other},   {0x200D, C::other},   {0x0301, C::other},
      {0x1F600, C::other}, {0x1F3FD, C::other},  {0x20000, C::letter}, {0x1D7CE, C::number},
      {0xD800, C::other},  {0x10FFFF, C::other}, {0x110000, C::other}, {0x00, C::other}};
  for (const auto& [c, expected] : cases) {
    EXPECT_EQ(gpt2_code_point_class(c), expected) << "U+" << std::hex << static_cast<uint32_t>(c);
  }
}

TEST(BpeUnicode, RangesAreSortedAndDisjoint) {
  std::vector<CodePointRange> all;
  for (CodePointClass cls :
       {CodePointClass::letter, CodePointClass::number, CodePointClass::space}) {
    const auto ranges = gpt2_class_ranges(cls);
    ASSERT_FALSE(ranges.empty());
    for (size_t i = 0; i < ranges.size(); ++i) {
      EXPECT_LE(ranges[i].first, ranges[i].last) << "range " << i;
      EXPECT_LE(ranges[i].last, 0x10FFFFu) << "range " << i;
      // Adjacent ranges would have been one: a gap of at least one code point.
      if (i > 0) {
        EXPECT_LT(ranges[i - 1].last + 1, ranges[i].first) << "range " << i;
      }
      all.push_back(ranges[i]);
    }
  }
  EXPECT_TRUE(gpt2_class_ranges(CodePointClass::other).empty());
  std::sort(all.begin(), all.end(), [](auto a, auto b) { return a.first < b.first; });
  for (size_t i = 1; i < all.size(); ++i) {
    EXPECT_LT(all[i - 1].last, all[i].first)
        << "the classes overlap at U+" << std::hex << static_cast<uint32_t>(all[i].first);
  }
  EXPECT_NE(std::string(gpt2_unicode_version()), "");
}

// ---- Pre-tokenizer (expected pieces: Encoder.js's regex under node 20) ------

TEST(BpePretokenize, Contractions) {
  // Lowercase only: "'LL" is a "'" then a word.
  EXPECT_EQ(gpt2_pretokenize("I'm don't WE'LL they've"),
            (Pieces{"I", "'m", " don", "'t", " WE", "'", "LL", " they", "'ve"}));
  EXPECT_EQ(gpt2_pretokenize("it's'"), (Pieces{"it", "'s", "'"}));
  EXPECT_EQ(gpt2_pretokenize("She'S"), (Pieces{"She", "'", "S"}));
  // A punctuation run that starts before the "'" takes it; so does " '".
  EXPECT_EQ(gpt2_pretokenize("''s"), (Pieces{"''", "s"}));
  EXPECT_EQ(gpt2_pretokenize(" 's x 'll"), (Pieces{" '", "s", " x", " '", "ll"}));
  EXPECT_EQ(gpt2_pretokenize("'"), (Pieces{"'"}));
  EXPECT_EQ(gpt2_pretokenize("we'll'd're've"), (Pieces{"we", "'ll", "'d", "'re", "'ve"}));
}

TEST(BpePretokenize, Whitespace) {
  // \s+(?!\S) leaves the run's last space to lead the next word.
  EXPECT_EQ(gpt2_pretokenize("a   b"), (Pieces{"a", "  ", " b"}));
  EXPECT_EQ(gpt2_pretokenize("a \n\n b"), (Pieces{"a", " \n\n", " b"}));
  EXPECT_EQ(gpt2_pretokenize("trailing   "), (Pieces{"trailing", "   "}));
  EXPECT_EQ(gpt2_pretokenize("x\ty\t\tz"), (Pieces{"x", "\t", "y", "\t", "\t", "z"}));
  EXPECT_EQ(gpt2_pretokenize("a\n"), (Pieces{"a", "\n"}));
  EXPECT_EQ(gpt2_pretokenize("  "), (Pieces{"  "}));
  EXPECT_EQ(gpt2_pretokenize(""), (Pieces{}));
  // NBSP, U+3000 and U+FEFF are JavaScript \s; only U+0020 leads a word.
  EXPECT_EQ(gpt2_pretokenize("a\u00a0b"), (Pieces{"a", "\u00a0", "b"}));
  EXPECT_EQ(gpt2_pretokenize("a\u3000\u3000b"), (Pieces{"a", "\u3000", "\u3000", "b"}));
  EXPECT_EQ(gpt2_pretokenize(" \u00a0x"), (Pieces{" ", "\u00a0", "x"}));
  EXPECT_EQ(gpt2_pretokenize("\ufeffx"), (Pieces{"\ufeff", "x"}));
  // U+0085 is not (it is \s in Python's regex module; Note [pre-tokenizer]).
  EXPECT_EQ(gpt2_pretokenize("a\u0085b"), (Pieces{"a", "\u0085", "b"}));
}

TEST(BpePretokenize, NumbersUnicodeAndPunctuation) {
  EXPECT_EQ(gpt2_pretokenize("2024 12.5"), (Pieces{"2024", " 12", ".", "5"}));
  EXPECT_EQ(gpt2_pretokenize("1,000,000"), (Pieces{"1", ",", "000", ",", "000"}));
  EXPECT_EQ(gpt2_pretokenize("naïve café Ελληνικά 日本語 ½ ٣"),
            (Pieces{"naïve", " café", " Ελληνικά", " 日本語", " ½", " ٣"}));
  // A skin-tone modifier and ZWJ are symbols: one run with the "!".
  EXPECT_EQ(gpt2_pretokenize("hi 👋🏽 👨‍👩‍👧!"),
            (Pieces{"hi", " 👋🏽", " 👨‍👩‍👧!"}));
  EXPECT_EQ(gpt2_pretokenize("!!!?..."), (Pieces{"!!!?..."}));
  EXPECT_EQ(gpt2_pretokenize("e\u0301"), (Pieces{"e", "\u0301"}));  // a combining mark
  EXPECT_EQ(gpt2_pretokenize("hello_world"), (Pieces{"hello", "_", "world"}));
}

TEST(BpePretokenize, InvalidUtf8BytesAreOthers) {
  // Note [invalid utf-8]: each such byte is one "other" code point.
  EXPECT_EQ(gpt2_pretokenize("a\xff"
                             "b"),
            (Pieces{"a", "\xff", "b"}));
  EXPECT_EQ(gpt2_pretokenize("ab\x80\x80!"), (Pieces{"ab", "\x80\x80!"}));
  EXPECT_EQ(gpt2_pretokenize("x \xc3"), (Pieces{"x", " \xc3"}));                  // truncated
  EXPECT_EQ(gpt2_pretokenize("\xc0\xaf"), (Pieces{"\xc0\xaf"}));                  // overlong '/'
  EXPECT_EQ(gpt2_pretokenize("\xed\xa0\x80z"), (Pieces{"\xed\xa0\x80", "z"}));    // a surrogate
  EXPECT_EQ(gpt2_pretokenize("\xf4\x90\x80\x80"), (Pieces{"\xf4\x90\x80\x80"}));  // > U+10FFFF
  EXPECT_EQ(gpt2_pretokenize("\xc3\xa9\xc3"), (Pieces{"\xc3\xa9", "\xc3"}));
}

// ---- BPE on a vocabulary worked out by hand --------------------------------

TEST(BpeByteSymbols, Mapping) {
  EXPECT_EQ(gpt2_byte_symbol('!'), "!");
  EXPECT_EQ(gpt2_byte_symbol('~'), "~");
  EXPECT_EQ(gpt2_byte_symbol(0xFF), "\u00ff");
  EXPECT_EQ(gpt2_byte_symbol(0xA1), "\u00a1");
  // The 68 others, in byte order: 0..32, then 127..160, then 173.
  EXPECT_EQ(gpt2_byte_symbol(0), "\u0100");
  EXPECT_EQ(gpt2_byte_symbol(' '), "\u0120");  // "Ġ"
  EXPECT_EQ(gpt2_byte_symbol(127), "\u0121");
  EXPECT_EQ(gpt2_byte_symbol(0xA0), "\u0142");
  EXPECT_EQ(gpt2_byte_symbol(0xAD), "\u0143");
}

// Bytes are ids 0..255 (in byte order); then the merges' results, in order.
Gpt2Tokenizer tiny_tokenizer() {
  std::vector<std::pair<std::string, std::string>> merges = {
      {"e", "r"},     // 0 -> "er"     256
      {"l", "o"},     // 1 -> "lo"     257
      {"lo", "w"},    // 2 -> "low"    258
      {"Ġ", "low"},   // 3 -> "Ġlow"   259
      {"low", "er"},  // 4 -> "lower"  260
      {"a", "a"},     // 5 -> "aa"     261
      {"o", "w"},     // 6 -> "ow"     262
      {"Ġ", "l"},     // 7 -> "Ġl"     263
      {"!", ","},     // 8 -> "!,"     264
      {",", "?"},     // 9 -> ",?"     265
      {"!", ",?"},    // 10 -> "!,?"   266
  };
  std::vector<std::pair<std::string, int32_t>> encoder;
  for (int b = 0; b < 256; ++b) encoder.emplace_back(gpt2_byte_symbol(static_cast<uint8_t>(b)), b);
  for (const auto& [l, r] : merges)
    encoder.emplace_back(l + r, static_cast<int32_t>(encoder.size()));
  encoder.emplace_back("<|endoftext|>", static_cast<int32_t>(encoder.size()));
  return Gpt2Tokenizer::from_parts(encoder, merges);
}

std::vector<int32_t> ids(std::initializer_list<int32_t> list) {
  return list;
}

TEST(BpeTinyVocabulary, MergesByRankNotPosition) {
  const Gpt2Tokenizer t = tiny_tokenizer();
  EXPECT_EQ(t.vocab_size(), 256 + 11 + 1);
  EXPECT_EQ(t.end_of_text(), 267);
  // l o w e r: er (0), lo (1), low (2), lower (4).
  EXPECT_EQ(t.encode("lower"), ids({260}));
  // Ġ l o w e r: er, lo, low; then Ġlow (3) before lower (4), and Ġlow+er is no merge.
  EXPECT_EQ(t.encode(" lower"), ids({259, 256}));
  // (l,o) = 1 before (o,w) = 6: "flow" is f + low, never f l + ow.
  EXPECT_EQ(t.encode("flow"), ids({'f', 258}));
  EXPECT_EQ(t.encode("owl"), ids({262, 'l'}));
  // Every non-overlapping occurrence, left to right.
  EXPECT_EQ(t.encode("aaaaa"), ids({261, 261, 'a'}));
  // Pieces are encoded apart: no merge crosses "a" | " lower".
  EXPECT_EQ(t.encode("aa lower"), ids({261, 259, 256}));
  // No merge applies: the byte tokens.
  EXPECT_EQ(t.encode("xyz"), ids({'x', 'y', 'z'}));
  EXPECT_EQ(t.encode(""), ids({}));
}

TEST(BpeTinyVocabulary, PairKeysAsEncoderJs) {
  // Note [merge keys]: after "!," (8) forms, ("!,", "?") is no merge, but its key
  // "!,,?" is that of ("!", ",?") (10), so Encoder.js (and this) joins it.
  const Gpt2Tokenizer t = tiny_tokenizer();
  EXPECT_EQ(t.encode("!,?"), ids({266}));
  EXPECT_EQ(t.encode("!,"), ids({264}));
  EXPECT_EQ(t.encode(",?"), ids({265}));
}

TEST(BpeTinyVocabulary, DecodeIsTheInverse) {
  const Gpt2Tokenizer t = tiny_tokenizer();
  const std::vector<int32_t> lower = {259, 256, 267};
  EXPECT_EQ(t.decode(lower), " lower<|endoftext|>");
  for (const std::string& text : {"aa lower\n\tflow!,?"s, "\x00\xff\x80 z"s}) {
    EXPECT_EQ(t.decode(t.encode(text)), text);
  }
  const std::vector<int32_t> bad = {1, 268};
  try {
    t.decode(bad);
    FAIL() << "decode accepted id 268";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("token 1 of 2 is 268, not an id of this vocabulary (0 to "
                                         "267)"),
              std::string::npos)
        << e.what();
  }
}

using test_util::value_error;

TEST(BpeTinyVocabulary, RefusesBrokenParts) {
  std::vector<std::pair<std::string, int32_t>> bytes;
  for (int b = 0; b < 256; ++b) bytes.emplace_back(gpt2_byte_symbol(static_cast<uint8_t>(b)), b);
  auto without_space = bytes;
  without_space[' '].first = "x y";
  EXPECT_NE(value_error([&] { Gpt2Tokenizer::from_parts(without_space, {}); }).find("holds U+0020"),
            std::string::npos);
  auto missing = bytes;
  missing.pop_back();
  EXPECT_NE(value_error([&] {
              Gpt2Tokenizer::from_parts(missing, {});
            }).find("no token for byte 0xFF (its symbol 'ÿ')"),
            std::string::npos);
  auto twice = bytes;
  twice.emplace_back("ab", 7);
  EXPECT_NE(value_error([&] {
              Gpt2Tokenizer::from_parts(twice, {});
            }).find("id 7 is given twice (again to 'ab')"),
            std::string::npos);
  auto beyond = bytes;
  beyond.emplace_back("ab", 300);
  EXPECT_NE(value_error([&] {
              Gpt2Tokenizer::from_parts(beyond, {});
            }).find("token 'ab' has id 300, outside 0 to 256"),
            std::string::npos);
  EXPECT_NE(value_error([&] {
              Gpt2Tokenizer::from_parts(bytes, {{"a", "b"}});
            }).find("merge 0: merge 'a b': 'ab' is not a token of the vocabulary"),
            std::string::npos);
}

// ---- Files -----------------------------------------------------------------

class BpeFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("ddp_bpe_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    std::string json = "{";
    for (int b = 0; b < 256; ++b) {
      json += json::quote(gpt2_byte_symbol(static_cast<uint8_t>(b))) + ": " + std::to_string(b) +
              (b < 255 ? ", " : "");
    }
    write("encoder.json", json + ", \"\\u0120a\": 256, \"\\u0120ab\": 257}\n");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name, std::ios::binary) << text;
  }
  std::filesystem::path dir_;
};

TEST_F(BpeFiles, LoadsEncoderJsonAndMerges) {
  write("vocab.bpe", "#version: 0.2\n\u0120 a\n\u0120a b\n");
  const Gpt2Tokenizer t = Gpt2Tokenizer::load(dir_.string());
  EXPECT_EQ(t.vocab_size(), 258);
  EXPECT_EQ(t.end_of_text(), -1);
  EXPECT_EQ(t.encode("x ab a"), ids({'x', 257, 256}));
}

TEST_F(BpeFiles, MalformedMergeLineNamesFileLineAndText) {
  write("vocab.bpe", "#version: 0.2\n\u0120 a\n\u0120a b c\n");
  const std::string e = value_error([&] { Gpt2Tokenizer::load(dir_.string()); });
  EXPECT_NE(e.find((dir_ / "vocab.bpe").string() + ":3: malformed merge '\u0120a b c'"),
            std::string::npos)
      << e;
  write("vocab.bpe", "\u0120 a\n");
  EXPECT_NE(value_error([&] {
              Gpt2Tokenizer::load(dir_.string());
            }).find("vocab.bpe:1: expected a version comment"),
            std::string::npos);
  write("vocab.bpe", "#version: 0.2\n\u0120 q\n");
  EXPECT_NE(value_error([&] {
              Gpt2Tokenizer::load(dir_.string());
            }).find("vocab.bpe:2: merge '\u0120 q': '\u0120q' is not a token of"),
            std::string::npos);
  write("encoder.json", "{\"a\": 1,}");
  EXPECT_NE(value_error([&] {
              Gpt2Tokenizer::load(dir_.string());
            }).find("encoder.json: at byte 8: expected a key string, found '}'"),
            std::string::npos);
}

TEST_F(BpeFiles, MissingFilesSayHowToInstall) {
  const std::string e = value_error([&] { Gpt2Tokenizer::load((dir_ / "nope").string()); });
  for (const char* part :
       {"folder '", "/nope' not found", "DDP_GPT2_BPE_DIR", "deploy/install-deps.sh"}) {
    EXPECT_NE(e.find(part), std::string::npos) << part << " in: " << e;
  }
  const std::string f = value_error([&] { Gpt2Tokenizer::load(dir_.string()); });  // no vocab.bpe
  EXPECT_NE(f.find((dir_ / "vocab.bpe").string() + "' not found"), std::string::npos) << f;
  EXPECT_NE(f.find("deploy/install-deps.sh"), std::string::npos) << f;
}

// ---- The installed vocabulary (deploy/install-deps.sh) ---------------------

// Skips without the vocabulary, but fails under DDP_REQUIRE_DATA=1 (deploy/test.sh).
class BpeGpt2Vocabulary : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = gpt2_bpe_dir();
    if (!std::filesystem::exists(dir + "/encoder.json") ||
        !std::filesystem::exists(dir + "/vocab.bpe")) {
      const char* require = std::getenv("DDP_REQUIRE_DATA");
      ASSERT_FALSE(require != nullptr && std::string(require) == "1")
          << "the GPT-2 BPE vocabulary is not installed in " << dir
          << "; run deploy/install-deps.sh";
      GTEST_SKIP() << "the GPT-2 BPE vocabulary is not installed in " << dir
                   << " (deploy/install-deps.sh installs it)";
    }
  }
  static const Gpt2Tokenizer& tokenizer() {
    static const Gpt2Tokenizer t = Gpt2Tokenizer::load(gpt2_bpe_dir());
    return t;
  }
};

TEST_F(BpeGpt2Vocabulary, KnownIds) {
  const Gpt2Tokenizer& t = tokenizer();
  EXPECT_EQ(t.vocab_size(), 50257);
  EXPECT_EQ(t.end_of_text(), 50256);
  EXPECT_EQ(t.encode("Hello world"), ids({15496, 995}));
  EXPECT_EQ(t.encode(" the"), ids({262}));
  EXPECT_EQ(t.decode(ids({50256})), "<|endoftext|>");
  // As text, it is not the special token (Encoder.js gives the same).
  EXPECT_EQ(t.encode("<|endoftext|>"), ids({27, 91, 437, 1659, 5239, 91, 29}));
  EXPECT_EQ(t.encode("I'm don't WE'LL they've"),
            ids({40, 1101, 836, 470, 12887, 6, 3069, 484, 1053}));
  EXPECT_EQ(t.encode("naïve café Ελληνικά 日本語 ½ ٣"),
            ids({2616, 38776, 40304, 7377, 243, 39377, 39377, 138,   115, 26180, 29945, 43000,
                 138,  105,   10545, 245,  98,  17312, 105,   45739, 252, 25208, 18923, 96}));
}

TEST_F(BpeGpt2Vocabulary, DecodeEncodeIsLossless) {
  const Gpt2Tokenizer& t = tokenizer();
  const std::vector<std::string> texts = {
      "I'm don't WE'LL they've",
      "a   b",
      "a \n\n b  \t\n",
      "2024 12.5 1,000,000",
      "naïve café Ελληνικά 日本語 ½ ٣ \u00a0\u3000\ufeff",
      "hi 👋🏽 👨‍👩‍👧! e\u0301",
      "!!!?...",
      "bad \xff\xfe bytes \x80 and \xc3 \xed\xa0\x80 \xc0\xaf\x00 end"s,
  };
  for (const std::string& text : texts) {
    const std::vector<int32_t> tokens = t.encode(text);
    EXPECT_EQ(t.decode(tokens), text);
    for (int32_t id : tokens) EXPECT_TRUE(id >= 0 && id < 50256) << id;
  }
}

}  // namespace
}  // namespace ddp
