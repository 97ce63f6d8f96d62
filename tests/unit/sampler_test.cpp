#include "runtime/data/sampler.h"

#include "runtime/error.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>

namespace ddp {
namespace {

using Indices = std::vector<int64_t>;

std::vector<Indices> shards(int64_t n, int world, SamplerOptions options, int64_t epoch = 0) {
  std::vector<Indices> out;
  for (int r = 0; r < world; ++r) {
    DistributedSampler s(n, r, world, options);
    s.set_epoch(epoch);
    out.push_back(s.indices());
  }
  return out;
}

// Values checked against torch.utils.data.distributed.DistributedSampler (PyTorch 1.13).
TEST(Sampler, MatchesPyTorchWithoutShuffle) {
  const SamplerOptions keep{.shuffle = false};
  const SamplerOptions drop{.shuffle = false, .drop_last = true};
  EXPECT_EQ(shards(10, 3, keep), (std::vector<Indices>{{0, 3, 6, 9}, {1, 4, 7, 0}, {2, 5, 8, 1}}));
  EXPECT_EQ(shards(10, 3, drop), (std::vector<Indices>{{0, 3, 6}, {1, 4, 7}, {2, 5, 8}}));
  EXPECT_EQ(shards(2, 5, keep), (std::vector<Indices>{{0}, {1}, {0}, {1}, {0}}));
  EXPECT_EQ(shards(7, 4, drop), (std::vector<Indices>{{0}, {1}, {2}, {3}}));
}

TEST(Sampler, ShardsAreEvenDisjointAndCovering) {
  for (int world = 1; world <= 5; ++world) {
    for (int64_t n : {0, 1, 2, 5, 7, 10, 11, 13, 64, 101}) {
      for (bool shuffle : {false, true}) {
        for (bool drop_last : {false, true}) {
          SCOPED_TRACE(::testing::Message() << "n=" << n << " world=" << world << " shuffle="
                                            << shuffle << " drop_last=" << drop_last);
          const auto parts =
              shards(n, world, {.shuffle = shuffle, .seed = 9, .drop_last = drop_last});
          const int64_t per_rank = drop_last ? n / world : (n + world - 1) / world;
          std::map<int64_t, int> seen;
          for (const Indices& part : parts) {
            ASSERT_EQ(static_cast<int64_t>(part.size()), per_rank);
            for (int64_t i : part) {
              ASSERT_TRUE(i >= 0 && i < n) << i;
              ++seen[i];
            }
          }
          if (drop_last) {
            // Disjoint: every index at most once; all but n % world of them present.
            EXPECT_EQ(static_cast<int64_t>(seen.size()), per_rank * world);
            for (const auto& [i, count] : seen) EXPECT_EQ(count, 1) << "index " << i;
          } else {
            // Covering: every index; only the padding (total - n indices) repeats.
            EXPECT_EQ(static_cast<int64_t>(seen.size()), n);
            int64_t repeats = 0;
            for (const auto& [i, count] : seen) repeats += count - 1;
            EXPECT_EQ(repeats, per_rank * world - n);
          }
        }
      }
    }
  }
}

// Note [uneven epochs] in trainer/uneven.h: drop_last=false with pad=false
// neither pads nor cuts: every index exactly once, rank r gets ceil((n - r) / W).
TEST(Sampler, UnevenSharesCoverEveryIndexOnce) {
  EXPECT_EQ(shards(10, 3, {.shuffle = false, .pad = false}),
            (std::vector<Indices>{{0, 3, 6, 9}, {1, 4, 7}, {2, 5, 8}}));
  EXPECT_EQ(shards(2, 5, {.shuffle = false, .pad = false}),
            (std::vector<Indices>{{0}, {1}, {}, {}, {}}));
  for (int world = 1; world <= 5; ++world) {
    for (int64_t n : {0, 1, 2, 7, 11, 64, 101}) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << " world=" << world);
      const SamplerOptions uneven{.seed = 9, .pad = false};
      const auto parts = shards(n, world, uneven, /*epoch=*/2);
      Indices all;
      for (int r = 0; r < world; ++r) {
        const DistributedSampler s(n, r, world, uneven);
        EXPECT_TRUE(s.uneven());
        EXPECT_EQ(s.num_samples(), (n - r + world - 1) / world);
        EXPECT_EQ(static_cast<int64_t>(parts[static_cast<size_t>(r)].size()), s.num_samples());
        EXPECT_EQ(s.max_num_samples(), (n + world - 1) / world);
        for (int q = 0; q < world; ++q) {
          EXPECT_EQ(s.num_samples_of(q), DistributedSampler(n, q, world, uneven).num_samples());
        }
        all.insert(all.end(), parts[static_cast<size_t>(r)].begin(),
                   parts[static_cast<size_t>(r)].end());
      }
      std::sort(all.begin(), all.end());
      Indices want(static_cast<size_t>(n));
      std::iota(want.begin(), want.end(), int64_t{0});
      EXPECT_EQ(all, want);
    }
  }
  // drop_last wins over pad = false; pad is the default.
  EXPECT_FALSE(DistributedSampler(10, 0, 3, {.drop_last = true, .pad = false}).uneven());
  EXPECT_FALSE(DistributedSampler(10, 0, 3).uneven());
}

TEST(Sampler, EveryRankAgreesOnTheEpochsOrder) {
  // Interleaving the ranks' shards gives back one permutation, the same for every
  // rank's sampler: the ranks agree without communicating.
  const int world = 4;
  const int64_t n = 100;
  const auto parts = shards(n, world, {.seed = 5}, /*epoch=*/3);
  Indices order;
  for (size_t k = 0; k < parts[0].size(); ++k) {
    for (int r = 0; r < world; ++r) order.push_back(parts[static_cast<size_t>(r)][k]);
  }
  EXPECT_EQ(order, philox_permutation(n, 5 + 3));
  EXPECT_EQ(parts, shards(n, world, {.seed = 5}, 3));
}

TEST(Sampler, EpochsAndSeedsChangeTheOrder) {
  DistributedSampler s(100, 1, 3, {.seed = 7});
  const Indices epoch0 = s.indices();
  s.set_epoch(1);
  const Indices epoch1 = s.indices();
  EXPECT_NE(epoch0, epoch1);
  s.set_epoch(0);
  EXPECT_EQ(s.indices(), epoch0);
  EXPECT_NE(DistributedSampler(100, 1, 3, {.seed = 8}).indices(), epoch0);
  EXPECT_EQ(DistributedSampler(100, 1, 3, {.shuffle = false}).indices()[0], 1);
}

TEST(Sampler, PhiloxPermutationIsAPermutationAndFixed) {
  for (int64_t n : {0, 1, 2, 3, 17, 1000}) {
    Indices p = philox_permutation(n, 42);
    std::sort(p.begin(), p.end());
    Indices expected(static_cast<size_t>(n));
    std::iota(expected.begin(), expected.end(), int64_t{0});
    EXPECT_EQ(p, expected) << "n=" << n;
  }
  // Pinned values (also from an independent Python transcription of Note [sampler
  // shuffle]): the order must not change across compilers, platforms or releases.
  EXPECT_EQ(philox_permutation(10, 0), (Indices{1, 7, 5, 2, 4, 0, 6, 8, 3, 9}));
}

TEST(Sampler, PhiloxPermutationIsRoughlyUniform) {
  // Each value lands in position 0 about 1/5 of the time (2000 draws: expected 400,
  // standard deviation about 18).
  std::vector<int> first(5, 0);
  for (uint64_t key = 0; key < 2000; ++key)
    ++first[static_cast<size_t>(philox_permutation(5, key)[0])];
  for (int count : first) {
    EXPECT_GT(count, 320);
    EXPECT_LT(count, 480);
  }
}

TEST(Sampler, InvalidRankOrWorldSize) {
  auto message = [](int64_t n, int rank, int world) -> std::string {
    try {
      DistributedSampler(n, rank, world);
    } catch (const ValueError& e) {
      return e.what();
    }
    return "(no error)";
  };
  EXPECT_EQ(message(10, 3, 3),
            "DistributedSampler: rank 3 is out of range for world_size 3 (valid ranks: 0 to 2)");
  EXPECT_EQ(message(10, -1, 2),
            "DistributedSampler: rank -1 is out of range for world_size 2 (valid ranks: 0 to 1)");
  EXPECT_EQ(message(10, 0, 0), "DistributedSampler: world_size must be >= 1, got 0");
  EXPECT_EQ(message(-5, 0, 1), "DistributedSampler: dataset_size must be >= 0, got -5");
}

TEST(Sampler, NumSamplesOfAnInvalidRankNamesTheRange) {
  const DistributedSampler s(10, 0, 3, {.pad = false});
  try {
    s.num_samples_of(3);
    ADD_FAILURE() << "no ValueError";
  } catch (const ValueError& e) {
    EXPECT_STREQ(e.what(),
                 "DistributedSampler::num_samples_of: rank 3 is out of range for world_size 3 "
                 "(valid ranks: 0 to 2)");
  }
}

// Note [elastic resharding]: 4 ranks take 5 steps of 16 samples each, then the
// 3 ranks left share out the rest of the epoch from position 320. Every sample of
// the epoch is taken exactly once (padding aside: fewer than 3 repeats, or with
// drop_last fewer than 3 left out).
TEST(Sampler, ReshardedRestTakesEverySampleOnce) {
  constexpr int64_t n = 1000, batch = 16, steps = 5;
  for (const bool drop : {false, true}) {
    SCOPED_TRACE(drop ? "drop_last" : "pad");
    const SamplerOptions options{.seed = 7, .drop_last = drop};
    std::map<int64_t, int> taken;
    int64_t start = 0;
    for (int r = 0; r < 4; ++r) {
      DistributedSampler s(n, r, 4, options);
      s.set_epoch(3);
      const Indices mine = s.indices();
      for (int64_t i = 0; i < steps * batch; ++i) ++taken[mine[static_cast<size_t>(i)]];
      start += steps * batch;
    }
    int64_t rest = 0;
    for (int r = 0; r < 3; ++r) {
      DistributedSampler s(n, r, 3, options);
      s.set_epoch(3, start);
      EXPECT_EQ(s.start(), start);
      EXPECT_EQ(s.remaining(), n - start);
      for (const int64_t i : s.indices()) ++taken[i];
      rest += s.num_samples();
    }
    EXPECT_EQ(rest, drop ? (n - start) / 3 * 3 : (n - start + 2) / 3 * 3);
    int64_t once = 0, twice = 0;
    for (const auto& [index, count] : taken) {
      EXPECT_LE(count, 2) << "sample " << index;
      once += count == 1;
      twice += count == 2;
    }
    if (drop) {
      EXPECT_EQ(twice, 0);
      EXPECT_EQ(once, start + rest);
      EXPECT_LT(n - once, 3);
    } else {
      EXPECT_EQ(once + twice, n);
      EXPECT_LT(twice, 3);
    }
  }
}

TEST(Sampler, StartZeroIsThePlainSamplerAndPastTheEndIsEmpty) {
  const SamplerOptions options{.seed = 3};
  DistributedSampler plain(100, 1, 3, options), started(100, 1, 3, options);
  plain.set_epoch(2);
  started.set_epoch(2, 0);
  EXPECT_EQ(plain.indices(), started.indices());
  started.set_epoch(2, 250);
  EXPECT_EQ(started.num_samples(), 0);
  EXPECT_TRUE(started.indices().empty());
  started.set_epoch(3);  // the next epoch starts at 0 again
  EXPECT_EQ(started.num_samples(), 34);
  DistributedSampler uneven(100, 0, 3, {.pad = false});
  EXPECT_THROW(uneven.set_epoch(1, 10), ValueError);
  EXPECT_THROW(plain.set_epoch(1, -1), ValueError);
}

}  // namespace
}  // namespace ddp
