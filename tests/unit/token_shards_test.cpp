// Token shards (runtime/data/token_shards.h): the .bin form of llm.c, built byte
// by byte here so that the expected values do not come from the writer, and the
// token streams the language task reads windows from.
#include "runtime/data/token_shards.h"
#include "runtime/data/text_corpus.h"
#include "runtime/data/text_windows.h"
#include "tests/unit/error_text.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>

namespace ddp {
namespace {

namespace fs = std::filesystem;

using test_util::error_text;

class TokenShards : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("ddp_token_shards_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // A shard by hand: the 256-int32 header (magic, version, count) and the tokens
  // at `width` bytes each, little-endian; `extra` bytes appended after them.
  std::string write_raw(const std::string& name, int32_t magic, int32_t version, int32_t count,
                        const std::vector<uint32_t>& tokens, int width, int extra = 0) {
    std::vector<uint8_t> b(1024, 0);
    auto put = [&](size_t at, uint32_t v, int n) {
      for (int k = 0; k < n; ++k) b[at + k] = static_cast<uint8_t>(v >> (8 * k));
    };
    put(0, static_cast<uint32_t>(magic), 4);
    put(4, static_cast<uint32_t>(version), 4);
    put(8, static_cast<uint32_t>(count), 4);
    for (uint32_t t : tokens) {
      b.resize(b.size() + width);
      put(b.size() - width, t, width);
    }
    b.resize(b.size() + extra, 0);
    std::ofstream(path(name), std::ios::binary)
        .write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
    return path(name);
  }

  std::vector<int64_t> all(const TokenStream& s) {
    std::vector<int64_t> out(static_cast<size_t>(s.size()));
    s.read(0, s.size(), out.data());
    return out;
  }

  fs::path dir_;
};

TEST_F(TokenShards, ReadsVersionOneAndTwoAsLlmcWritesThem) {
  const std::string v1 = write_raw("a.bin", 20240520, 1, 4, {50256, 15496, 995, 0}, 2);
  const std::string v2 = write_raw("b.bin", 20240520, 2, 3, {128000, 7, 70000}, 4);
  const TokenStream s = TokenStream::open_shards({v1, v2});
  EXPECT_EQ(s.size(), 7);
  EXPECT_EQ(all(s), (std::vector<int64_t>{50256, 15496, 995, 0, 128000, 7, 70000}));
  EXPECT_EQ(s.max_token(), 128000);
  EXPECT_EQ(s.at(4), 128000);
  EXPECT_EQ(s.describe(), "2 shards, 7 tokens");
  EXPECT_FALSE(s.is_bytes());
}

TEST_F(TokenShards, WriterPicksTheNarrowestVersionAndRoundTrips) {
  const std::vector<int32_t> small = {0, 1, 65535, 300};
  write_token_shard(path("s.bin"), small);
  EXPECT_EQ(fs::file_size(path("s.bin")), 1024u + 2 * small.size());
  const std::vector<int32_t> big = {65536, 2};
  write_token_shard(path("l.bin"), big);
  EXPECT_EQ(fs::file_size(path("l.bin")), 1024u + 4 * big.size());
  const TokenStream s = TokenStream::open_shards({path("s.bin"), path("l.bin")});
  EXPECT_EQ(all(s), (std::vector<int64_t>{0, 1, 65535, 300, 65536, 2}));
  const std::vector<int32_t> negative = {3, -1};
  EXPECT_NE(error_text([&] {
              write_token_shard(path("n.bin"), negative);
            }).find("token -1 at position 1 is negative"),
            std::string::npos);
}

TEST_F(TokenShards, MalformedFilesNameTheFileTheOffsetAndTheExpectation) {
  std::ofstream(path("short.bin")) << "tiny";
  EXPECT_NE(error_text([&] {
              TokenStream::open_shards({path("short.bin")});
            }).find("short.bin: 4 bytes, but a shard starts with a 1024-byte header"),
            std::string::npos);
  const std::string magic = write_raw("magic.bin", 1234, 1, 1, {5}, 2);
  EXPECT_NE(error_text([&] {
              TokenStream::open_shards({magic});
            }).find("magic.bin: offset 0 holds 1234, expected the magic 20240520"),
            std::string::npos);
  const std::string version = write_raw("version.bin", 20240520, 7, 1, {5}, 2);
  EXPECT_NE(error_text([&] {
              TokenStream::open_shards({version});
            }).find("offset 4 holds version 7, expected 1 (uint16 tokens) or 2"),
            std::string::npos);
  const std::string truncated = write_raw("trunc.bin", 20240520, 1, 5, {1, 2, 3}, 2);
  EXPECT_NE(error_text([&] { TokenStream::open_shards({truncated}); })
                .find("counts 5 tokens of 2 bytes, which need 10 bytes after the 1024-byte "
                      "header, but the file has 6"),
            std::string::npos);
  const std::string padded = write_raw("pad.bin", 20240520, 1, 3, {1, 2, 3}, 2, 1);
  EXPECT_NE(error_text([&] { TokenStream::open_shards({padded}); }).find("the file has 7"),
            std::string::npos);
  EXPECT_NE(error_text([&] {
              TokenStream::open_shards({path("absent.bin")});
            }).find("absent.bin: cannot open it"),
            std::string::npos);
}

TEST_F(TokenShards, ReadsAcrossShardEndsAndRefusesPastTheEnd) {
  const std::vector<int32_t> a = {1, 2, 3}, empty_shard = {}, b = {4, 5};
  write_token_shard(path("a.bin"), a);
  write_token_shard(path("e.bin"), empty_shard);
  write_token_shard(path("b.bin"), b);
  const TokenStream s = TokenStream::open_shards({path("a.bin"), path("e.bin"), path("b.bin")});
  std::vector<int64_t> out(4);
  s.read(1, 4, out.data());
  EXPECT_EQ(out, (std::vector<int64_t>{2, 3, 4, 5}));
  EXPECT_NE(error_text([&] {
              s.read(3, 3, out.data());
            }).find("tokens [3, 6) asked of a stream of 5 tokens"),
            std::string::npos);
  const TokenStream tail = TokenStream::slice(s, 2, 3);
  EXPECT_EQ(all(tail), (std::vector<int64_t>{3, 4, 5}));
  EXPECT_EQ(tail.max_token(), 5);
  EXPECT_EQ(TokenStream::slice(s, 0, 2).max_token(), 2);
}

TEST_F(TokenShards, ADirectorySplitsTrainAndValidationShardsByName) {
  const std::vector<int32_t> t = {1, 2};
  for (const char* name : {"fw_train_000002.bin", "fw_val_000000.bin", "fw_train_000001.bin"}) {
    write_token_shard(path(name), t);
  }
  std::ofstream(path("notes.txt")) << "not a shard";
  EXPECT_TRUE(is_token_shard_data(dir_.string()));
  EXPECT_TRUE(is_token_shard_data("x.bin"));
  EXPECT_FALSE(is_token_shard_data(path("notes.txt")));
  const ShardFiles files = find_token_shards(dir_.string());
  EXPECT_EQ(files.train,
            (std::vector<std::string>{path("fw_train_000001.bin"), path("fw_train_000002.bin")}));
  EXPECT_EQ(files.validation, (std::vector<std::string>{path("fw_val_000000.bin")}));
  fs::remove(path("fw_train_000001.bin"));
  fs::remove(path("fw_train_000002.bin"));
  EXPECT_NE(error_text([&] {
              find_token_shards(dir_.string());
            }).find("every .bin file in " + dir_.string() + " is a validation shard"),
            std::string::npos);
}

// "val" as a part of the name, not anywhere in it (survival_train_000001.bin was
// read as validation); --test-data's shards may all be validation ones.
TEST_F(TokenShards, ValidationShardsAreNamedByAPartOfTheName) {
  for (const char* name :
       {"fineweb_val_000000.bin", "val.bin", "shakespeare-val.bin", "x.validation.bin",
        "data_VAL_000000.bin", "wiki.valid.bin", "eval.bin"}) {
    EXPECT_TRUE(is_validation_shard_name(name)) << name;
  }
  for (const char* name : {"survival_train_000001.bin", "interval_train_000001.bin", "medieval.bin",
                           "travel_val2.bin", "data_train_000001.bin"}) {
    EXPECT_FALSE(is_validation_shard_name(name)) << name;
  }
  const std::vector<int32_t> t = {1, 2};
  write_token_shard(path("interval_train_000001.bin"), t);
  write_token_shard(path("interval_val_000000.bin"), t);
  const ShardFiles files = find_token_shards(dir_.string());
  EXPECT_EQ(files.train, (std::vector<std::string>{path("interval_train_000001.bin")}));
  EXPECT_EQ(files.validation, (std::vector<std::string>{path("interval_val_000000.bin")}));
  fs::remove(path("interval_train_000001.bin"));
  EXPECT_EQ(find_token_shards(dir_.string(), /*for_validation=*/true).validation,
            (std::vector<std::string>{path("interval_val_000000.bin")}));
  EXPECT_NE(
      error_text([&] { find_token_shards(dir_.string()); }).find("(or pass these as --test-data)"),
      std::string::npos);
}

TEST_F(TokenShards, WindowsOfBytesAreTheSameFromAStreamAsFromTheString) {
  const std::string text = "the quick brown fox jumps over the lazy dog";
  const TokenStream s = TokenStream::from_bytes(text);
  EXPECT_TRUE(s.is_bytes());
  EXPECT_EQ(s.max_token(), 'z');
  const std::vector<int64_t> starts = {0, 7, 30};
  const TokenBatch a = window_batch(text, starts, 8), b = window_batch(s, starts, 8);
  EXPECT_EQ(a.inputs.to_vector<int64_t>(), b.inputs.to_vector<int64_t>());
  EXPECT_EQ(a.targets.to_vector<int64_t>(), b.targets.to_vector<int64_t>());
  EXPECT_EQ(b.targets.to_vector<int64_t>()[0], 'h');
}

TEST_F(TokenShards, EntropiesPerTokenMatchTheByteCountsOnBytes) {
  const std::string text = "abracadabra, abracadabra! a cabbage";
  const ByteEntropy bytes = byte_entropies(text);
  const TokenEntropy tokens = token_entropies(TokenStream::from_bytes(text));
  EXPECT_NEAR(tokens.unigram_bits, bytes.unigram_bits, 1e-12);
  EXPECT_NEAR(tokens.bigram_bits, bytes.bigram_bits, 1e-12);
  // Two equally likely tokens that alternate: 1 bit each, nothing left given the last.
  const std::vector<int32_t> alternating = {60000, 7, 60000, 7, 60000, 7};
  write_token_shard(path("alt.bin"), alternating);
  const TokenEntropy alt = token_entropies(TokenStream::open_shards({path("alt.bin")}));
  EXPECT_NEAR(alt.unigram_bits, 1.0, 1e-12);
  EXPECT_NEAR(alt.bigram_bits, 0.0, 1e-12);
}

}  // namespace
}  // namespace ddp
