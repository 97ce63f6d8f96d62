#include "runtime/dtype.h"
#include "runtime/error.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace ddp {
namespace {

TEST(DType, SizesAndNames) {
  EXPECT_EQ(element_size(DType::f32), 4u);
  EXPECT_EQ(element_size(DType::bf16), 2u);
  EXPECT_EQ(element_size(DType::f16), 2u);
  EXPECT_EQ(element_size(DType::i32), 4u);
  EXPECT_EQ(element_size(DType::i64), 8u);
  EXPECT_EQ(element_size(DType::u8), 1u);
  for (DType d : kAllDTypes) EXPECT_EQ(parse_dtype(dtype_name(d)), d);
  EXPECT_EQ(parse_dtype("bfloat16"), DType::bf16);
  EXPECT_THROW(parse_dtype("f64"), ValueError);
}

// float64 is not a ddp dtype: the error names it, the supported dtypes and the fix.
TEST(DType, Float64IsNamedInTheError) {
  for (const char* name : {"f64", "float64", "double"}) {
    try {
      parse_dtype(name);
      FAIL() << name << " parsed";
    } catch (const ValueError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(std::string("dtype '") + name + "' (float64) is not supported by ddp"),
                std::string::npos)
          << what;
      EXPECT_NE(what.find("supported: f32, bf16, f16, i32, i64, u8"), std::string::npos) << what;
      EXPECT_NE(what.find(".to(torch.float32)"), std::string::npos) << what;
    }
  }
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_float(0x3f80), 1.0f);
  // 1 + 2^-8 lies exactly between 1 and 1 + 2^-7: ties to even (1.0).
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  // 1 + 3 * 2^-8 is between 1 + 2^-7 (odd) and 1 + 2^-6 (even): ties to even.
  EXPECT_EQ(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
  EXPECT_EQ(bf16_to_float(float_to_bf16(-INFINITY)), -INFINITY);
}

TEST(DType, F16MatchesIeeeHalf) {
  EXPECT_EQ(float_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(float_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(float_to_f16(65504.0f), 0x7bff);                      // largest finite
  EXPECT_EQ(float_to_f16(65520.0f), 0x7c00);                      // rounds to inf
  EXPECT_EQ(float_to_f16(std::ldexp(1.0f, -24)), 0x0001);         // smallest subnormal
  EXPECT_EQ(float_to_f16(std::ldexp(1.0f, -14)), 0x0400);         // smallest normal
  EXPECT_EQ(float_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie to even
  EXPECT_EQ(f16_to_float(0x3555), 0.333251953125f);
  EXPECT_EQ(f16_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(NAN))));
  // Every finite half survives a round trip through float.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00) continue;
    ASSERT_EQ(float_to_f16(f16_to_float(static_cast<uint16_t>(h))), h) << std::hex << h;
  }
}

// The half's value from its fields, in double arithmetic (independent of dtype.cpp).
double reference_half(uint32_t h) {
  const double sign = (h & 0x8000u) ? -1.0 : 1.0;
  const int exp = static_cast<int>((h >> 10) & 0x1f);
  const double mant = static_cast<double>(h & 0x3ffu);
  if (exp == 0) return sign * std::ldexp(mant, -24);
  if (exp == 31) return mant != 0 ? NAN : sign * INFINITY;
  return sign * std::ldexp(1024.0 + mant, exp - 25);
}

TEST(DType, F16ToFloatIsExactForEveryHalf) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const double want = reference_half(h);
    const float got = f16_to_float(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << std::hex << h;
    } else {
      ASSERT_EQ(static_cast<double>(got), want) << std::hex << h;
    }
  }
}

// Note [f16 conversion]: the bulk conversions (F16C where the CPU has it) equal
// the scalar ones bit for bit on every half, and on floats around every
// rounding boundary, subnormals, overflow and the specials; lengths that are
// not a multiple of 8 take the scalar tail.
TEST(DType, BulkF16ConversionsMatchTheScalarOnes) {
  std::vector<uint16_t> halves(0x10000 + 3);
  for (size_t i = 0; i < halves.size(); ++i) halves[i] = static_cast<uint16_t>(i);
  std::vector<float> floats(halves.size());
  f16_to_floats(halves.data(), floats.data(), halves.size());
  for (size_t i = 0; i < halves.size(); ++i) {
    const float want = f16_to_float(halves[i]);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(floats[i])) << std::hex << i;
    } else {
      ASSERT_EQ(std::memcmp(&floats[i], &want, 4), 0) << std::hex << i;
    }
  }
  // Floats: every half, the midpoints to its neighbours and one ulp either side
  // of them (round to nearest even), plus values past the range.
  std::vector<float> inputs;
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_to_float(static_cast<uint16_t>(h));
    const float next = f16_to_float(static_cast<uint16_t>(h + 1));
    if (!std::isfinite(f) || !std::isfinite(next)) continue;
    const float mid = static_cast<float>((static_cast<double>(f) + next) / 2);
    for (float v : {f, mid, std::nextafter(mid, f), std::nextafter(mid, next)}) {
      inputs.push_back(v);
    }
  }
  for (float v : {65504.0f, 65519.0f, 65520.0f, 1e9f, -1e9f, INFINITY, -INFINITY, 1e-10f, -0.0f,
                  std::ldexp(1.0f, -25), std::ldexp(1.5f, -25), NAN}) {
    inputs.push_back(v);
  }
  std::vector<uint16_t> got(inputs.size());
  floats_to_f16(inputs.data(), got.data(), inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const uint16_t want = float_to_f16(inputs[i]);
    if (std::isnan(inputs[i])) {
      EXPECT_TRUE(std::isnan(f16_to_float(got[i])));
    } else {
      ASSERT_EQ(got[i], want) << "input " << inputs[i] << " (index " << i << ")";
    }
  }
  std::printf("f16 conversions %s F16C\n", f16c_available() ? "use" : "do not use");
}

}  // namespace
}  // namespace ddp
