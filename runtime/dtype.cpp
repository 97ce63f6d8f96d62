#include "runtime/dtype.h"

#include "runtime/error.h"

#include <cmath>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

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
  if (t == "f64" || t == "float64" || t == "double") {
    throw ValueError(fmt::format(
        "dtype '{}' (float64) is not supported by ddp; supported: f32, bf16, f16, i32, i64, u8. "
        "Use f32: convert float64 data to float32 first (PyTorch: .to(torch.float32), NumPy: "
        ".astype(np.float32))",
        t));
  }
  throw ValueError(
      fmt::format("unknown dtype '{}'; valid dtypes are f32, bf16, f16, i32, i64, u8", t));
}

bool is_floating(DType dtype) {
  return dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16;
}

// Bit arithmetic rather than ldexp: this runs once per element of an f16 tensor.
float f16_to_float(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in float
    const float magnitude = static_cast<float>(mant) * 0x1p-24f;
    std::memcpy(&u, &magnitude, 4);
    u |= sign;
  } else if (exp == 31) {  // inf, or NaN with its payload
    u = sign | 0x7f800000u | (mant << 13);
  } else {  // normal: rebias the exponent 15 -> 127
    u = sign | ((exp + (127u - 15u)) << 23) | (mant << 13);
  }
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

// Note [f16 conversion]: compiled for F16C with a target attribute and chosen at
// run time, so the build needs no -mf16c and runs on any x86-64. Other
// architectures take the scalar loop (this is the one place an #if picks code:
// it is an instruction set, not a dependency CMake finds).
namespace {

#if defined(__x86_64__)
__attribute__((target("avx,f16c"))) void floats_to_f16_f16c(const float* src, uint16_t* dst,
                                                            size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h =
        _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  for (; i < n; ++i) dst[i] = float_to_f16(src[i]);
}

__attribute__((target("avx,f16c"))) void f16_to_floats_f16c(const uint16_t* src, float* dst,
                                                            size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) dst[i] = f16_to_float(src[i]);
}

bool detect_f16c() {
  return __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
}
#else
void floats_to_f16_f16c(const float*, uint16_t*, size_t) {}
void f16_to_floats_f16c(const uint16_t*, float*, size_t) {}
bool detect_f16c() {
  return false;
}
#endif

bool use_f16c() {
  static const bool use = detect_f16c();
  return use;
}

}  // namespace

bool f16c_available() {
  return use_f16c();
}

void floats_to_f16(const float* src, uint16_t* dst, size_t n) {
  if (use_f16c()) return floats_to_f16_f16c(src, dst, n);
  for (size_t i = 0; i < n; ++i) dst[i] = float_to_f16(src[i]);
}

void f16_to_floats(const uint16_t* src, float* dst, size_t n) {
  if (use_f16c()) return f16_to_floats_f16c(src, dst, n);
  for (size_t i = 0; i < n; ++i) dst[i] = f16_to_float(src[i]);
}

}  // namespace ddp
