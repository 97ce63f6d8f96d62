#include "runtime/data/text_corpus.h"
#include "runtime/data/text_windows.h"

#include "runtime/error.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>

namespace ddp {
namespace {

// Two paragraphs of Brown's Form C: a blank line before each paragraph, one
// tab-indented sentence per line, every token word/tag.
constexpr std::string_view kTagged =
    "\n\n\tThe/at jury/nn said/vbd ``/`` no/at evidence/nn ''/'' ,/, it/pps added/vbd ./.\n"
    "\tAtlanta's/np$ 1/2/cd mayor/nn-tl (/( Mr./np )/) won/vbd ./.\n"
    "\n\n\tHe/pps asked/vbd `/` why/wrb '/' ?/.\n";

TEST(TextCorpus, StripsTagsAndKeepsParagraphs) {
  EXPECT_EQ(strip_brown_tags(kTagged),
            "The jury said \"no evidence\", it added. Atlanta's 1/2 mayor (Mr.) won.\n"
            "He asked 'why'?");
  EXPECT_EQ(strip_brown_tags("untagged words/nn here"), "untagged words here");
  EXPECT_EQ(strip_brown_tags(""), "");
}

TEST(TextCorpus, SplitsEveryTenthDocumentToValidation) {
  std::vector<std::string> docs;
  for (int i = 0; i < 25; ++i) docs.push_back("d" + std::to_string(i));
  const TextCorpus a = split_documents(docs, "t");
  EXPECT_EQ(a.validation, "d9\n\nd19");
  EXPECT_EQ(a.validation_documents, 2);
  EXPECT_EQ(a.train_documents, 23);
  // Every document lands in exactly one split, and again in the same one.
  for (int i = 0; i < 25; ++i) {
    const std::string d = "d" + std::to_string(i);
    auto has = [&](const std::string& text) {
      return ("\n\n" + text + "\n\n").find("\n\n" + d + "\n\n") != std::string::npos;
    };
    EXPECT_NE(has(a.train), has(a.validation)) << d;
    EXPECT_EQ(has(a.validation), is_validation_document(i)) << d;
  }
  const TextCorpus b = split_documents(docs, "t");
  EXPECT_EQ(a.train, b.train);
  EXPECT_EQ(a.validation, b.validation);
}

TEST(TextCorpus, EntropiesMatchClosedForms) {
  std::string abab, aabb;
  for (int i = 0; i < 1000; ++i) {
    abab += "ab";
    aabb += "aabb";
  }
  ByteEntropy e = byte_entropies(abab);
  EXPECT_NEAR(e.unigram_bits, 1.0, 1e-12);  // two bytes, equally often
  EXPECT_NEAR(e.bigram_bits, 0.0, 1e-12);   // the next byte is determined
  e = byte_entropies(aabb);
  EXPECT_NEAR(e.unigram_bits, 1.0, 1e-12);
  EXPECT_NEAR(e.bigram_bits, 1.0, 1e-3);  // after a: a or b, nearly 1/2 each
  e = byte_entropies(std::string(100, 'x'));
  EXPECT_EQ(e.unigram_bits, 0.0);
  EXPECT_EQ(e.bigram_bits, 0.0);
  // Four symbols with probabilities 1/2, 1/4, 1/8, 1/8: 1.75 bits.
  EXPECT_NEAR(byte_entropies("aaaabbcd").unigram_bits, 1.75, 1e-12);
}

TEST(TextCorpus, SyntheticStreamIsDeterministicAndHasItsEntropy) {
  const TextCorpus a = make_synthetic_text({.train_bytes = 200000, .seed = 7});
  EXPECT_EQ(a.name, "synthetic");
  EXPECT_EQ(a.train.size(), 200000u);
  EXPECT_EQ(a.train, make_synthetic_text({.train_bytes = 200000, .seed = 7}).train);
  EXPECT_NE(a.train, make_synthetic_text({.train_bytes = 200000, .seed = 8}).train);
  // At most 3 successors each, so the bigram entropy is at most log2(3) (less
  // where a symbol's 3 draws coincide) and well below the unigram's.
  const ByteEntropy e = byte_entropies(a.train);
  EXPECT_LE(e.bigram_bits, std::log2(3.0) + 0.01);
  EXPECT_GT(e.bigram_bits, 0.5);
  EXPECT_GT(e.unigram_bits, e.bigram_bits + 1.0);
}

TEST(TextCorpus, MissingCorpusFallsBackToSyntheticOrNamesTheFix) {
  const std::string dir = "/nonexistent/brown";
  testing::internal::CaptureStderr();
  const TextCorpus c = load_text_corpus_or_synthetic(dir, {.train_bytes = 100});
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(c.name, "synthetic");
  EXPECT_NE(err.find("SYNTHETIC"), std::string::npos) << err;
  EXPECT_NE(err.find(dir), std::string::npos) << err;
  try {
    load_brown_corpus(dir);
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("deploy/install-deps.sh"), std::string::npos) << e.what();
  }
}

std::vector<std::vector<int64_t>> rank_starts(int64_t bytes, int64_t ctx, int world,
                                              SamplerOptions o, int64_t epoch) {
  std::vector<std::vector<int64_t>> out;
  for (int r = 0; r < world; ++r) {
    TextWindowSampler s(bytes, ctx, r, world, o);
    s.set_epoch(epoch);
    out.push_back(s.starts());
  }
  return out;
}

TEST(TextWindows, DisjointAcrossRanksInsideTheStream) {
  const int64_t bytes = 10000, ctx = 63;
  for (int world : {1, 2, 3, 5}) {
    for (int64_t epoch : {0, 1, 2}) {
      const auto shards = rank_starts(bytes, ctx, world, {.seed = 3}, epoch);
      std::vector<int64_t> all;
      for (const auto& s : shards) {
        EXPECT_EQ(s.size(), shards[0].size());  // every rank runs as many steps
        all.insert(all.end(), s.begin(), s.end());
      }
      std::sort(all.begin(), all.end());
      EXPECT_EQ(all.size(), static_cast<size_t>((bytes - ctx) / (ctx + 1) / world * world));
      for (size_t i = 0; i < all.size(); ++i) {
        EXPECT_GE(all[i], 0);
        EXPECT_LE(all[i] + ctx + 1, bytes);
        // ctx + 1 bytes apart at least: no byte is in two windows of an epoch.
        if (i > 0) {
          EXPECT_GE(all[i] - all[i - 1], ctx + 1) << "world " << world;
        }
      }
    }
  }
}

// pad = false (train --drop-last false): the windows are shared unevenly, none dropped.
TEST(TextWindows, UnevenSharesKeepEveryWindow) {
  const int64_t bytes = 10000, ctx = 63, windows = (bytes - ctx) / (ctx + 1);  // 155
  const auto shards = rank_starts(bytes, ctx, 3, {.seed = 3, .pad = false}, 1);
  std::vector<int64_t> all;
  for (int r = 0; r < 3; ++r) {
    const auto& s = shards[static_cast<size_t>(r)];
    EXPECT_EQ(static_cast<int64_t>(s.size()), (windows - r + 2) / 3);
    EXPECT_EQ(TextWindowSampler(bytes, ctx, 0, 3, {.pad = false}).num_windows_of(r),
              static_cast<int64_t>(s.size()));
    all.insert(all.end(), s.begin(), s.end());
  }
  std::sort(all.begin(), all.end());
  EXPECT_EQ(static_cast<int64_t>(std::unique(all.begin(), all.end()) - all.begin()), windows);
  // The default (pad) drops: padding would repeat windows.
  EXPECT_FALSE(TextWindowSampler(bytes, ctx, 0, 3, {}).uneven());
}

// Note [elastic resharding] for the text windows: 4 ranks take 5 steps of 8
// windows each in epoch 2, then the 3 ranks left (the samplers resharded) take
// the rest of the epoch from position 160. Every window of the epoch -- on the
// epoch's boundaries -- is taken exactly once, but the fewer than 3 the cut
// leaves out.
TEST(TextWindows, ReshardedRestTakesEveryWindowOnce) {
  const int64_t bytes = 40000, ctx = 63, windows = (bytes - ctx) / (ctx + 1);  // 624
  constexpr int64_t batch = 8, steps = 5, epoch = 2;
  const SamplerOptions options{.seed = 9};
  std::map<int64_t, int> taken;  // window start -> times taken
  int64_t start = 0, offset = -1;
  for (int r = 0; r < 4; ++r) {
    TextWindowSampler s(bytes, ctx, r, 4, options);
    s.set_epoch(epoch);
    offset = s.offset();
    const std::vector<int64_t> mine = s.starts();
    for (int64_t i = 0; i < steps * batch; ++i) ++taken[mine[static_cast<size_t>(i)]];
    start += steps * batch;
  }
  int64_t rest = 0;
  for (int r = 0; r < 3; ++r) {
    TextWindowSampler s(bytes, ctx, r, 4, options);  // a rank of the old world, resharded
    s.set_epoch(epoch - 1);
    s.reshard(r, 3);
    s.set_epoch(epoch, start);
    EXPECT_EQ(s.start(), start);
    EXPECT_EQ(s.remaining(), windows - start);
    EXPECT_EQ(s.offset(), offset);
    EXPECT_EQ(s.num_windows(), (windows - start) / 3);
    for (const int64_t w : s.starts()) ++taken[w];
    rest += s.num_windows();
  }
  EXPECT_EQ(rest, (windows - start) / 3 * 3);
  for (const auto& [w, count] : taken) {
    EXPECT_EQ(count, 1) << "the window at " << w;
    EXPECT_EQ((w - offset) % (ctx + 1), 0) << "the window at " << w << " is off the boundaries";
    EXPECT_GE(w, 0);
    EXPECT_LE(w + ctx + 1, bytes);
  }
  EXPECT_EQ(static_cast<int64_t>(taken.size()), start + rest);
  EXPECT_LT(windows - static_cast<int64_t>(taken.size()), 3);
  // Resharded to the same world from position 0, it is the plain sampler again.
  TextWindowSampler plain(bytes, ctx, 1, 3, options), resharded(bytes, ctx, 0, 4, options);
  resharded.reshard(1, 3);
  plain.set_epoch(epoch);
  resharded.set_epoch(epoch, 0);
  EXPECT_EQ(plain.starts(), resharded.starts());
}

TEST(TextWindows, ReshuffledPerEpochAndReproducibleFromTheSeed) {
  const auto e0 = rank_starts(50000, 127, 2, {.seed = 11}, 0);
  const auto e1 = rank_starts(50000, 127, 2, {.seed = 11}, 1);
  EXPECT_EQ(e0, rank_starts(50000, 127, 2, {.seed = 11}, 0));
  EXPECT_NE(e0, e1);
  EXPECT_NE(e0, rank_starts(50000, 127, 2, {.seed = 12}, 0));
  // The boundaries move too, not only the order: the offsets of 8 epochs differ.
  std::set<int64_t> offsets;
  TextWindowSampler s(50000, 127, 0, 2, {.seed = 11});
  for (int64_t e = 0; e < 8; ++e) {
    s.set_epoch(e);
    offsets.insert(s.offset());
  }
  EXPECT_GT(offsets.size(), 4u);
  // Without shuffle: windows 0, 1, 2, ... at offset 0, rank r taking every W-th.
  EXPECT_EQ(rank_starts(1000, 9, 2, {.shuffle = false}, 5)[1][0], 10);
}

TEST(TextWindows, TargetIsTheInputShiftedByOne) {
  const std::string stream = "abcdefghijklmnopqrstuvwxyz";
  const std::vector<int64_t> starts = {0, 10, 21};
  const TokenBatch b = window_batch(stream, starts, 4);
  ASSERT_EQ(b.inputs.shape(), (Shape{3, 4}));
  EXPECT_EQ(b.inputs.to_vector<int64_t>(),
            (std::vector<int64_t>{'a', 'b', 'c', 'd', 'k', 'l', 'm', 'n', 'v', 'w', 'x', 'y'}));
  EXPECT_EQ(b.targets.to_vector<int64_t>(),
            (std::vector<int64_t>{'b', 'c', 'd', 'e', 'l', 'm', 'n', 'o', 'w', 'x', 'y', 'z'}));
  const std::vector<int64_t> past_end = {22};
  EXPECT_THROW(window_batch(stream, past_end, 4), ValueError);
}

TEST(TextWindows, RejectsAStreamTooShortForTheRanks) {
  try {
    TextWindowSampler(100, 64, 0, 2);
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("needs at least 194 tokens"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(TextWindowSampler(100, 0, 0, 1), ValueError);
}

// The real corpus, installed by deploy/install-deps.sh (which deploy/test.sh
// runs, setting DDP_REQUIRE_DATA=1 so that a missing corpus fails, not skips).
TEST(TextCorpus, LoadsTheInstalledBrownCorpus) {
  if (!std::filesystem::exists(std::string(kBrownCorpusDir) + "/cats.txt")) {
    const char* require = std::getenv("DDP_REQUIRE_DATA");
    ASSERT_FALSE(require != nullptr && std::string(require) == "1")
        << "the Brown corpus is not installed in " << kBrownCorpusDir
        << "; run deploy/install-deps.sh";
    GTEST_SKIP() << "the Brown corpus is not installed in " << kBrownCorpusDir
                 << " (deploy/install-deps.sh installs it)";
  }
  const TextCorpus c = load_brown_corpus(kBrownCorpusDir);
  EXPECT_EQ(c.train_documents, 450);
  EXPECT_EQ(c.validation_documents, 50);
  const size_t total = c.train.size() + c.validation.size();
  EXPECT_GT(total, 5'000'000u);  // about 6 MB of text without tags
  EXPECT_LT(total, 7'000'000u);
  EXPECT_EQ(c.train.find("/nn"), std::string::npos);  // no tag is left
  EXPECT_NE(c.train.find("The Fulton County Grand Jury said Friday"), std::string::npos);
  const ByteEntropy train = byte_entropies(c.train);
  const ByteEntropy val = byte_entropies(c.validation);
  std::printf("brown: %zu bytes (train %zu in %lld documents, validation %zu in %lld)\n", total,
              c.train.size(), static_cast<long long>(c.train_documents), c.validation.size(),
              static_cast<long long>(c.validation_documents));
  std::printf(
      "brown: train unigram %.4f bits/byte, bigram %.4f; validation unigram %.4f, "
      "bigram %.4f\n",
      train.unigram_bits, train.bigram_bits, val.unigram_bits, val.bigram_bits);
  // English letters: a unigram entropy near 4.5 bits, bigram near 3.5.
  EXPECT_GT(train.unigram_bits, 4.0);
  EXPECT_LT(train.unigram_bits, 5.0);
  EXPECT_LT(train.bigram_bits, train.unigram_bits - 0.5);
}

}  // namespace
}  // namespace ddp
