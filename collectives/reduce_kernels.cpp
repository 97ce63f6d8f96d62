#include "collectives/reduce_kernels.h"

#include <algorithm>
#include <cstring>

namespace ddp::comm {
namespace {

// How a block of T is accumulated: in T itself (direct: read in place), or in
// float for the 16-bit types, converted a block at a time.
template <typename T>
struct Acc {
  using type = T;
  static constexpr bool direct = true;
};
template <>
struct Acc<BFloat16> {
  using type = float;
  static constexpr bool direct = false;
  static void load(const BFloat16* src, float* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_float(src[i].bits);
  }
  static void store(const float* in, BFloat16* dst, int64_t n) {
    for (int64_t i = 0; i < n; ++i) dst[i] = {float_to_bf16(in[i])};
  }
};
template <>
struct Acc<Half> {  // Note [f16 conversion] in runtime/dtype.h
  using type = float;
  static constexpr bool direct = false;
  static void load(const Half* src, float* out, int64_t n) {
    f16_to_floats(reinterpret_cast<const uint16_t*>(src), out, static_cast<size_t>(n));
  }
  static void store(const float* in, Half* dst, int64_t n) {
    floats_to_f16(in, reinterpret_cast<uint16_t*>(dst), static_cast<size_t>(n));
  }
};

template <typename V>
void combine(V* acc, const V* src, int64_t len, ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      for (int64_t i = 0; i < len; ++i) acc[i] += src[i];
      break;
    case ReduceOp::max:
      for (int64_t i = 0; i < len; ++i) acc[i] = std::max(acc[i], src[i]);
      break;
    case ReduceOp::min:
      for (int64_t i = 0; i < len; ++i) acc[i] = std::min(acc[i], src[i]);
      break;
  }
}

template <typename T>
void reduce_typed(T* dst, const void* const* srcs, int n, int64_t count, ReduceOp op,
                  double scale) {
  using A = Acc<T>;
  using V = typename A::type;
  constexpr int64_t kBlock = 1024;
  V acc[kBlock];
  [[maybe_unused]] V converted[A::direct ? 1 : kBlock];
  for (int64_t base = 0; base < count; base += kBlock) {
    const int64_t len = std::min(kBlock, count - base);
    auto source = [&](int k) -> const V* {
      const T* src = static_cast<const T*>(srcs[k]) + base;
      if constexpr (A::direct) {
        return src;
      } else {
        A::load(src, converted, len);
        return converted;
      }
    };
    const V* first = source(0);
    std::copy(first, first + len, acc);
    for (int k = 1; k < n; ++k) combine(acc, source(k), len, op);
    if (op == ReduceOp::avg) {
      for (int64_t i = 0; i < len; ++i) acc[i] = static_cast<V>(acc[i] * static_cast<V>(scale));
    }
    if constexpr (A::direct) {
      std::copy(acc, acc + len, dst + base);
    } else {
      A::store(acc, dst + base, len);
    }
  }
}

}  // namespace

void check_reducible(DType dtype, ReduceOp op) {
  DDP_CHECK(dtype != DType::u8, "dtype u8 cannot be reduced; valid: f32, bf16, f16, i32, i64");
  DDP_CHECK(op != ReduceOp::avg || is_floating(dtype),
            "ReduceOp avg needs a floating dtype (f32, bf16, f16), got {}; use sum and divide, or "
            "cast first",
            dtype_name(dtype));
}

void reduce_buffers(void* dst, const void* const* srcs, int n, int64_t count, DType dtype,
                    ReduceOp op, double scale) {
  switch (dtype) {
    case DType::f32:
      return reduce_typed(static_cast<float*>(dst), srcs, n, count, op, scale);
    case DType::bf16:
      return reduce_typed(static_cast<BFloat16*>(dst), srcs, n, count, op, scale);
    case DType::f16:
      return reduce_typed(static_cast<Half*>(dst), srcs, n, count, op, scale);
    case DType::i32:
      return reduce_typed(static_cast<int32_t*>(dst), srcs, n, count, op, scale);
    case DType::i64:
      return reduce_typed(static_cast<int64_t*>(dst), srcs, n, count, op, scale);
    case DType::u8:
      break;
  }
  throw ValueError(fmt::format("dtype {} cannot be reduced", dtype_name(dtype)));
}

}  // namespace ddp::comm
