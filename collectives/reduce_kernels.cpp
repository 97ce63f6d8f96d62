#include "collectives/reduce_kernels.h"

#include <algorithm>
#include <cstring>

namespace ddp::comm {
namespace {

template <typename T>
struct Acc {
  using type = T;
  static type load(T v) { return v; }
  static T store(type v) { return v; }
};
template <>
struct Acc<BFloat16> {
  using type = float;
  static float load(BFloat16 v) { return bf16_to_float(v.bits); }
  static BFloat16 store(float v) { return {float_to_bf16(v)}; }
};
template <>
struct Acc<Half> {
  using type = float;
  static float load(Half v) { return f16_to_float(v.bits); }
  static Half store(float v) { return {float_to_f16(v)}; }
};

template <typename T>
void reduce_typed(T* dst, const void* const* srcs, int n, int64_t count, ReduceOp op,
                  double scale) {
  using A = Acc<T>;
  using V = typename A::type;
  constexpr int64_t kBlock = 1024;
  V acc[kBlock];
  for (int64_t base = 0; base < count; base += kBlock) {
    const int64_t len = std::min(kBlock, count - base);
    const T* first = static_cast<const T*>(srcs[0]) + base;
    for (int64_t i = 0; i < len; ++i) acc[i] = A::load(first[i]);
    for (int k = 1; k < n; ++k) {
      const T* src = static_cast<const T*>(srcs[k]) + base;
      switch (op) {
        case ReduceOp::sum:
        case ReduceOp::avg:
          for (int64_t i = 0; i < len; ++i) acc[i] += A::load(src[i]);
          break;
        case ReduceOp::max:
          for (int64_t i = 0; i < len; ++i) acc[i] = std::max(acc[i], A::load(src[i]));
          break;
        case ReduceOp::min:
          for (int64_t i = 0; i < len; ++i) acc[i] = std::min(acc[i], A::load(src[i]));
          break;
      }
    }
    if (op == ReduceOp::avg) {
      for (int64_t i = 0; i < len; ++i) acc[i] = static_cast<V>(acc[i] * static_cast<V>(scale));
    }
    for (int64_t i = 0; i < len; ++i) dst[base + i] = A::store(acc[i]);
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
