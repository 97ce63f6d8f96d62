#include "runtime/dtype.h"
#include "runtime/error.h"

#include <gtest/gtest.h>

#include <cmath>

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

}  // namespace
}  // namespace ddp
