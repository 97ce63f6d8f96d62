#include "runtime/rng/philox.h"
#include "runtime/tensor.h"

#include <gtest/gtest.h>

#include <cmath>

namespace ddp {
namespace {

// Known-answer vectors of Philox 4x32-10 from the Random123 distribution (kat_vectors).
TEST(Philox, KnownAnswers) {
  struct Kat {
    rng::Philox4 ctr;
    uint32_t k0, k1;
    rng::Philox4 expected;
  };
  const Kat kats[] = {
      {{{0, 0, 0, 0}}, 0, 0, {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}}},
      {{{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}},
       0xffffffff,
       0xffffffff,
       {{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}}},
      {{{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}},
       0xa4093822,
       0x299f31d0,
       {{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}}},
  };
  for (const Kat& kat : kats) {
    const rng::Philox4 got = rng::philox4x32_10(kat.ctr, kat.k0, kat.k1);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(got.v[i], kat.expected.v[i]) << "word " << i;
  }
}

TEST(Rng, SameSeedSameStreamDifferentSeedDifferent) {
  EXPECT_EQ(rand({1000}, 42).to_vector<float>(), rand({1000}, 42).to_vector<float>());
  EXPECT_NE(rand({1000}, 42).to_vector<float>(), rand({1000}, 43).to_vector<float>());
}

TEST(Rng, OffsetContinuesTheStream) {
  // Elements 8.. of a long draw equal a draw at offset 2 (two counters of 4 elements).
  const auto whole = randn({20}, 7).to_vector<float>();
  const auto tail = randn({12}, 7, {}, 2).to_vector<float>();
  EXPECT_EQ(std::vector<float>(whole.begin() + 8, whole.end()), tail);
  EXPECT_EQ(rng::philox_counters(20), 5u);
}

TEST(Rng, ElementMappingFollowsTheNote) {
  const auto u = rand({6}, 99).to_vector<float>();
  const rng::Philox4 b0 = rng::philox_block(99, 0), b1 = rng::philox_block(99, 1);
  EXPECT_EQ(u[0], rng::uniform_from_word(b0.v[0]));
  EXPECT_EQ(u[3], rng::uniform_from_word(b0.v[3]));
  EXPECT_EQ(u[5], rng::uniform_from_word(b1.v[1]));
}

TEST(Rng, UniformAndNormalMoments) {
  const int64_t n = 200000;
  const auto u = rand({n}, 1).to_vector<float>();
  const auto z = randn({n}, 2).to_vector<float>();
  double su = 0, suu = 0, sz = 0, szz = 0;
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_GE(u[static_cast<size_t>(i)], 0.0f);
    ASSERT_LT(u[static_cast<size_t>(i)], 1.0f);
    ASSERT_TRUE(std::isfinite(z[static_cast<size_t>(i)]));
    su += u[static_cast<size_t>(i)];
    suu += u[static_cast<size_t>(i)] * u[static_cast<size_t>(i)];
    sz += z[static_cast<size_t>(i)];
    szz += z[static_cast<size_t>(i)] * z[static_cast<size_t>(i)];
  }
  // Standard errors: mean of U(0,1) 0.5 +- 0.00065, of N(0,1) 0 +- 0.0022 (5 sigma bounds).
  EXPECT_NEAR(su / n, 0.5, 0.0035);
  EXPECT_NEAR(suu / n - (su / n) * (su / n), 1.0 / 12.0, 0.002);
  EXPECT_NEAR(sz / n, 0.0, 0.012);
  EXPECT_NEAR(szz / n, 1.0, 0.02);
}

TEST(Rng, RandInOtherFloatDtypes) {
  const Tensor h = rand({16}, 5, {.dtype = DType::bf16});
  EXPECT_EQ(h.dtype(), DType::bf16);
  EXPECT_THROW(rand({4}, 1, {.dtype = DType::i32}), ValueError);
}

}  // namespace
}  // namespace ddp
