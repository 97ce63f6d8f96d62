#include "runtime/dtype.h"

#include "runtime/error.h"

#include <cmath>

namespace ddp {

size_t element_size(DType dtype) {
  switch (dtype) {
    case DType::f32:
    case DType::i32:
      return 4;
    case DType::bf16:
    case DType::f16:
      return 2;
    case DType::i64:
      return 8;
    case DType::u8:
      return 1;
  }
  DDP_ASSERT(false, "unknown dtype {}", static_cast<int>(dtype));
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "f32";
    case DType::bf16:
      return "bf16";
    case DType::f16:
      return "f16";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
    case DType::u8:
      return "u8";
  }
  return "?";
}

DType parse_dtype(std::string_view t) {
  if (t == "f32" || t == "float32" || t == "float") return DType::f32;
  if (t == "bf16" || t == "bfloat16") return DType::bf16;
  if (t == "f16" || t == "float16" || t == "half") return DType::f16;
  if (t == "i32" || t == "int32" || t == "int") return DType::i32;
  if (t == "i64" || t == "int64" || t == "long") return DType::i64;
  if (t == "u8" || t == "uint8") return DType::u8;
  throw ValueError(
      fmt::format("unknown dtype '{}'; valid dtypes are f32, bf16, f16, i32, i64, u8", t));
}

bool is_floating(DType dtype) {
  return dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16;
}

float f16_to_float(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ffu;
  float magnitude;
  if (exp == 0) {
    magnitude = std::ldexp(static_cast<float>(mant), -24);  // zero or subnormal
  } else if (exp == 31) {
    magnitude = mant ? NAN : INFINITY;
  } else {
    magnitude = std::ldexp(static_cast<float>(mant | 0x400u), static_cast<int>(exp) - 25);
  }
  uint32_t u;
  std::memcpy(&u, &magnitude, 4);
  u |= sign;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t float_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // overflow (>= 65520) -> inf
  if (abs < 0x38800000u) {                        // below the smallest normal f16: subnormal
    // Value in units of 2^-24, rounded to nearest even.
    float mag;
    std::memcpy(&mag, &abs, 4);
    const float scaled = mag * 16777216.0f;  // exact: power-of-two scaling
    const float rounded = std::nearbyint(scaled);
    return sign | static_cast<uint16_t>(rounded);
  }
  // Normal: rebias exponent 127 -> 15 and round the 23-bit mantissa to 10 bits.
  uint32_t v = abs - ((127u - 15u) << 23);
  v += 0xfffu + ((v >> 13) & 1u);
  return sign | static_cast<uint16_t>(v >> 13);
}

}  // namespace ddp
