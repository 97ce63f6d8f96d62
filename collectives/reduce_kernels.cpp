#include "collectives/reduce_kernels.h"

#include "runtime/ops/cpu/clones.h"

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

// Note [one-pass reduction]: a block of the result is made in one pass over the
// sources, acc[i] = s0[i] op s1[i] (op s2[i] ...), with the avg scale applied in
// the pass that reads the last source, then copied to dst (which may alias a
// source). Every element is combined in source order and scaled last, as a
// loop over the sources one after the other would, so the bits do not depend on
// the block size or the vector width; and with -ffp-contract=off (Note [cpu
// kernel clones]) the AVX-512 and AVX2 copies give the plain copy's bits. It
// was four passes (copy, add, scale, copy), at SSE2's width: the shm backend's
// 0.8 MB all_reduce spent 14 us of its 37 us chunk there (docs/backends.md).
template <typename V>
DDP_CPU_INLINE V combine_one(V a, V b, ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      return a + b;
    case ReduceOp::max:
      return std::max(a, b);
    case ReduceOp::min:
      return std::min(a, b);
  }
  return a;
}

// acc[i] = a[i] op b[i] for i < len (a == nullptr: acc[i] op b[i]), times
// `scale` when `scaled`. acc is the block's own buffer, never a source.
template <typename V, ReduceOp Op>
DDP_CPU_INLINE void combine_block(V* __restrict acc, const V* a, const V* b, int64_t len,
                                  bool scaled, V scale) {
  if (a == nullptr) {
    if (scaled) {
      for (int64_t i = 0; i < len; ++i)
        acc[i] = static_cast<V>(combine_one(acc[i], b[i], Op) * scale);
    } else {
      for (int64_t i = 0; i < len; ++i) acc[i] = combine_one(acc[i], b[i], Op);
    }
  } else if (scaled) {
    for (int64_t i = 0; i < len; ++i) acc[i] = static_cast<V>(combine_one(a[i], b[i], Op) * scale);
  } else {
    for (int64_t i = 0; i < len; ++i) acc[i] = combine_one(a[i], b[i], Op);
  }
}

template <typename V>
DDP_CPU_INLINE void combine_block(V* __restrict acc, const V* a, const V* b, int64_t len,
                                  ReduceOp op, bool scaled, V scale) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      return combine_block<V, ReduceOp::sum>(acc, a, b, len, scaled, scale);
    case ReduceOp::max:
      return combine_block<V, ReduceOp::max>(acc, a, b, len, scaled, scale);
    case ReduceOp::min:
      return combine_block<V, ReduceOp::min>(acc, a, b, len, scaled, scale);
  }
}

template <typename T>
DDP_CPU_INLINE void reduce_typed(T* dst, const void* const* srcs, int n, int64_t count, ReduceOp op,
                                 double scale) {
  using A = Acc<T>;
  using V = typename A::type;
  constexpr int64_t kBlock = 1024;
  alignas(64) V acc[kBlock];
  [[maybe_unused]] alignas(64) V converted[A::direct ? 1 : kBlock];
  const bool avg = op == ReduceOp::avg;
  const auto factor = static_cast<V>(scale);
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
    if (n == 1) {
      const V* only = source(0);
      if (avg) {
        for (int64_t i = 0; i < len; ++i) acc[i] = static_cast<V>(only[i] * factor);
      } else {
        std::copy(only, only + len, acc);
      }
    } else {
      // The first pass reads sources 0 and 1; a converted source 0 is converted
      // straight into acc (source(1) reuses the conversion buffer).
      if constexpr (A::direct) {
        combine_block(acc, source(0), source(1), len, op, avg && n == 2, factor);
      } else {
        A::load(static_cast<const T*>(srcs[0]) + base, acc, len);
        combine_block(acc, static_cast<const V*>(nullptr), source(1), len, op, avg && n == 2,
                      factor);
      }
      for (int k = 2; k < n; ++k) {
        combine_block(acc, static_cast<const V*>(nullptr), source(k), len, op, avg && k == n - 1,
                      factor);
      }
    }
    if constexpr (A::direct) {
      std::copy(acc, acc + len, dst + base);
    } else {
      A::store(acc, dst + base, len);
    }
  }
}

// One copy per ISA of each element type (Note [cpu kernel clones]).
DDP_CPU_CLONES
void reduce_f32(float* dst, const void* const* srcs, int n, int64_t count, ReduceOp op,
                double scale) {
  reduce_typed(dst, srcs, n, count, op, scale);
}

DDP_CPU_CLONES
void reduce_bf16(BFloat16* dst, const void* const* srcs, int n, int64_t count, ReduceOp op,
                 double scale) {
  reduce_typed(dst, srcs, n, count, op, scale);
}

DDP_CPU_CLONES
void reduce_i32(int32_t* dst, const void* const* srcs, int n, int64_t count, ReduceOp op,
                double scale) {
  reduce_typed(dst, srcs, n, count, op, scale);
}

DDP_CPU_CLONES
void reduce_i64(int64_t* dst, const void* const* srcs, int n, int64_t count, ReduceOp op,
                double scale) {
  reduce_typed(dst, srcs, n, count, op, scale);
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
      return reduce_f32(static_cast<float*>(dst), srcs, n, count, op, scale);
    case DType::bf16:
      return reduce_bf16(static_cast<BFloat16*>(dst), srcs, n, count, op, scale);
    case DType::f16:  // no ISA copies: its conversions are calls (Note [f16 conversion])
      return reduce_typed(static_cast<Half*>(dst), srcs, n, count, op, scale);
    case DType::i32:
      return reduce_i32(static_cast<int32_t*>(dst), srcs, n, count, op, scale);
    case DType::i64:
      return reduce_i64(static_cast<int64_t*>(dst), srcs, n, count, op, scale);
    case DType::u8:
      break;
  }
  throw ValueError(fmt::format("dtype {} cannot be reduced", dtype_name(dtype)));
}

}  // namespace ddp::comm
