// Element types and the host-side conversions between f32, bf16 and f16.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace ddp {

enum class DType : uint8_t { f32, bf16, f16, i32, i64, u8 };

inline constexpr DType kAllDTypes[] = {DType::f32, DType::bf16, DType::f16,
                                       DType::i32, DType::i64,  DType::u8};

size_t element_size(DType dtype);
// Short name as used in ddp's messages and flags: "f32", "bf16", ...
std::string_view dtype_name(DType dtype);
// Parses "f32"/"float32"/"float", "bf16"/"bfloat16", "f16"/"float16"/"half",
// "i32"/"int32", "i64"/"int64"/"long", "u8"/"uint8". Throws ValueError listing them
// (naming float64 as unsupported, with the conversion to use, for "f64"/"float64"/"double").
DType parse_dtype(std::string_view text);
bool is_floating(DType dtype);

// Storage types of the 16-bit floats: raw bits, converted on the host by the
// functions below (round to nearest even, NaN kept NaN).
struct BFloat16 {
  uint16_t bits;
};
struct Half {
  uint16_t bits;
};

inline float bf16_to_float(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float f16_to_float(uint16_t bits);
uint16_t float_to_f16(float f);
// Note [f16 conversion]: the same conversions over n values, with the F16C
// instructions where the CPU has them (every x86-64 since 2012 that has AVX2;
// 8 values per instruction) and the functions above otherwise. Results are
// equal bit for bit, except that a NaN may keep another payload (still a NaN).
// The fp16 comm hook and the f16 reductions of the CPU backends go through
// them: converting one value at a time made the fp16 hook 6x slower than none.
void floats_to_f16(const float* src, uint16_t* dst, size_t n);
void f16_to_floats(const uint16_t* src, float* dst, size_t n);
bool f16c_available();  // whether the two above use F16C on this CPU

// The dtype of a C++ element type. Any other type (double above all: ddp has no
// float64) stops the compilation with the message below instead of an
// incomplete-type or undefined-symbol error.
template <typename T>
inline constexpr bool kIsTensorElement = false;
template <typename T>
struct DTypeOf {
  static_assert(kIsTensorElement<T>,
                "ddp tensors hold float (f32), BFloat16 (bf16), Half (f16), int32_t (i32), "
                "int64_t (i64) or uint8_t (u8): there is no float64 (double) dtype. Convert the "
                "values to float first, e.g. std::vector<float>(v.begin(), v.end())");
  static constexpr DType value = DType::f32;  // not reached; keeps follow-on errors quiet
};
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::f32;
};
template <>
struct DTypeOf<BFloat16> {
  static constexpr DType value = DType::bf16;
};
template <>
struct DTypeOf<Half> {
  static constexpr DType value = DType::f16;
};
template <>
struct DTypeOf<int32_t> {
  static constexpr DType value = DType::i32;
};
template <>
struct DTypeOf<int64_t> {
  static constexpr DType value = DType::i64;
};
template <>
struct DTypeOf<uint8_t> {
  static constexpr DType value = DType::u8;
};

}  // namespace ddp
