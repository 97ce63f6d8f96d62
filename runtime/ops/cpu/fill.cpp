// CPU fill, cast, arange and the Philox random fills.
#include "runtime/ops/kernels.h"
#include "runtime/rng/philox.h"

namespace ddp::kernels::cpu {
namespace {

// Conversions through float for the 16-bit types, static_cast otherwise.
template <typename T>
struct Convert {
  static T from(double v) { return static_cast<T>(v); }
  static T from_float(float v) { return static_cast<T>(v); }
  static float to_float(T v) { return static_cast<float>(v); }
  static double to_double(T v) { return static_cast<double>(v); }
};
template <>
struct Convert<BFloat16> {
  static BFloat16 from(double v) { return {float_to_bf16(static_cast<float>(v))}; }
  static BFloat16 from_float(float v) { return {float_to_bf16(v)}; }
  static float to_float(BFloat16 v) { return bf16_to_float(v.bits); }
  static double to_double(BFloat16 v) { return bf16_to_float(v.bits); }
};
template <>
struct Convert<Half> {
  static Half from(double v) { return {float_to_f16(static_cast<float>(v))}; }
  static Half from_float(float v) { return {float_to_f16(v)}; }
  static float to_float(Half v) { return f16_to_float(v.bits); }
  static double to_double(Half v) { return f16_to_float(v.bits); }
};

// Calls fn(T{}) with T the C++ type of `dtype`.
template <typename Fn>
void visit_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::f32:
      return fn(float{});
    case DType::bf16:
      return fn(BFloat16{});
    case DType::f16:
      return fn(Half{});
    case DType::i32:
      return fn(int32_t{});
    case DType::i64:
      return fn(int64_t{});
    case DType::u8:
      return fn(uint8_t{});
  }
}

template <typename S, typename D>
void cast_loop(const S* src, D* dst, int64_t n) {
  constexpr bool src_is_16 = std::is_same_v<S, BFloat16> || std::is_same_v<S, Half>;
  constexpr bool dst_is_16 = std::is_same_v<D, BFloat16> || std::is_same_v<D, Half>;
  for (int64_t i = 0; i < n; ++i) {
    if constexpr (src_is_16 || dst_is_16 || std::is_same_v<S, float>) {
      // Through float: exact for every value a 16-bit float or f32 holds.
      dst[i] = Convert<D>::from_float(Convert<S>::to_float(src[i]));
    } else {
      dst[i] = static_cast<D>(src[i]);
    }
  }
}

// float32 <-> f16 in bulk (Note [f16 conversion] in dtype.h); non-templates,
// so overload resolution prefers them to cast_loop<S, D>.
void cast_loop(const float* src, Half* dst, int64_t n) {
  floats_to_f16(src, reinterpret_cast<uint16_t*>(dst), static_cast<size_t>(n));
}
void cast_loop(const Half* src, float* dst, int64_t n) {
  f16_to_floats(reinterpret_cast<const uint16_t*>(src), dst, static_cast<size_t>(n));
}

}  // namespace

void fill(Tensor& t, double value) {
  visit_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T v = Convert<T>::from(value);
    T* p = static_cast<T*>(t.data_ptr());
    std::fill(p, p + t.numel(), v);
  });
}

void cast(const Tensor& src, Tensor& dst) {
  visit_dtype(src.dtype(), [&](auto s) {
    visit_dtype(dst.dtype(), [&](auto d) {
      using S = decltype(s);
      using D = decltype(d);
      cast_loop(static_cast<const S*>(src.data_ptr()), static_cast<D*>(dst.data_ptr()),
                src.numel());
    });
  });
}

void arange(Tensor& t, double start, double step) {
  visit_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(t.data_ptr());
    for (int64_t i = 0, n = t.numel(); i < n; ++i) {
      p[i] = Convert<T>::from(start + static_cast<double>(i) * step);
    }
  });
}

// See Note [rng stream] in rng/philox.h.
void fill_uniform(Tensor& t, uint64_t seed, uint64_t offset) {
  float* p = t.data<float>();
  const int64_t n = t.numel();
  for (int64_t g = 0; g * 4 < n; ++g) {
    const rng::Philox4 block = rng::philox_block(seed, offset + static_cast<uint64_t>(g));
    for (int64_t j = 0; j < 4 && g * 4 + j < n; ++j)
      p[g * 4 + j] = rng::uniform_from_word(block.v[j]);
  }
}

void fill_normal(Tensor& t, uint64_t seed, uint64_t offset) {
  float* p = t.data<float>();
  const int64_t n = t.numel();
  for (int64_t g = 0; g * 4 < n; ++g) {
    const rng::Philox4 block = rng::philox_block(seed, offset + static_cast<uint64_t>(g));
    float v[4];
    rng::normal_pair(block.v[0], block.v[1], &v[0], &v[1]);
    rng::normal_pair(block.v[2], block.v[3], &v[2], &v[3]);
    for (int64_t j = 0; j < 4 && g * 4 + j < n; ++j) p[g * 4 + j] = v[j];
  }
}

}  // namespace ddp::kernels::cpu
