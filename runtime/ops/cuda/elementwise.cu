// Elementwise CUDA kernels: arithmetic (f32, bf16, f16), casts, fill and arange (any
// dtype).
// Grid-stride kernel templates (launch.cuh) run a small functor per element: of the
// values (map_elements, in 16-byte vectors: Note [vectorized elementwise]) where the
// arrays are contiguous and the element's index does not matter, else of the index.
#include "runtime/ops/cuda/launch.cuh"  // first (see its top)

#include "runtime/ops/cuda/float_types.cuh"
#include "runtime/ops/kernels.h"
#include "runtime/ops/mixed_math.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

namespace ddp::kernels::cuda {
namespace {

using detail::for_each_index;
using detail::map_elements;
using detail::ptr;

// ---- arithmetic: f32, bf16 and f16, each element in f32 and rounded once ------

using detail::dispatch_float;
using detail::from_float;
using detail::to_float;

template <BinaryOp Op, typename A, typename B, typename Out>
struct BinaryFn {
  __device__ Out operator()(A a, B b) const {
    const float x = to_float(a), y = to_float(b);
    if constexpr (Op == BinaryOp::add) {
      return from_float<Out>(x + y);
    } else if constexpr (Op == BinaryOp::sub) {
      return from_float<Out>(x - y);
    } else if constexpr (Op == BinaryOp::mul) {
      return from_float<Out>(x * y);
    } else if constexpr (Op == BinaryOp::bce_logits) {
      return from_float<Out>(math::bce_logits_value(x, y));
    } else {
      return from_float<Out>(math::bce_logits_grad(x, y));
    }
  }
};

// out's dtype is a's and b's when they agree, else f32 (ops.cpp's promote).
template <BinaryOp Op>
void launch_binary(const Tensor& a, const Tensor& b, Tensor& out) {
  dispatch_float(a.dtype(), [&](auto a_tag) {
    using A = typename decltype(a_tag)::type;
    dispatch_float(b.dtype(), [&](auto b_tag) {
      using B = typename decltype(b_tag)::type;
      using Out = std::conditional_t<std::is_same_v<A, B>, A, float>;
      DDP_ASSERT(out.dtype() == (std::is_same_v<A, B> ? a.dtype() : DType::f32),
                 "binary: out dtype {} for inputs {} and {}", dtype_name(out.dtype()),
                 dtype_name(a.dtype()), dtype_name(b.dtype()));
      map_elements("binary", out, out.numel(), BinaryFn<Op, A, B, Out>{}, ptr<Out>(out),
                   ptr<const A>(a), ptr<const B>(b));
    });
  });
}

template <typename T>
struct UnaryFn {
  int op;
  __device__ T operator()(T x) const { return from_float<T>(math::unary_value(op, to_float(x))); }
};

template <typename T>
struct UnaryBackwardFn {
  int op;
  __device__ T operator()(T grad, T x) const {
    return from_float<T>(to_float(grad) * math::unary_derivative(op, to_float(x)));
  }
};

template <typename T>
struct ScaleFn {
  float s;
  __device__ T operator()(T a) const { return from_float<T>(to_float(a) * s); }
};

// Reads the value on the device: no host round trip (and no sync) for a scalar
// that a kernel just produced, such as the upstream gradient of a sum.
struct BroadcastScalarFn {
  const float* scalar;
  float* out;
  __device__ void operator()(int64_t i) const { out[i] = *scalar; }
};

// y + alpha * x, into y.
struct AxpyFn {
  float alpha;
  __device__ float operator()(float x, float y) const { return y + alpha * x; }
};

// x, bias and out each f32 or 16-bit: linear's bias epilogue (ops.cpp) adds an f32
// or bf16 bias to the f32 product and rounds once into a bf16 out.
template <typename X, typename Bias, typename Out>
struct AddBiasRowsFn {
  const X* x;
  const Bias* bias;
  int64_t cols;
  Out* out;
  __device__ void operator()(int64_t i) const {
    out[i] = from_float<Out>(to_float(x[i]) + to_float(bias[i % cols]));
  }
};

template <typename T>
struct ReluFn {
  // As the CPU's std::max(x, 0) and torch.relu: NaN stays NaN (x > 0 ? x : 0 made
  // it 0, hiding a NaN from every check after it), -0.0 stays -0.0.
  __device__ T operator()(T x) const { return to_float(x) < 0.0f ? from_float<T>(0.0f) : x; }
};

template <typename T>
struct ReluBackwardFn {
  __device__ T operator()(T grad, T x) const {
    return to_float(x) > 0.0f ? grad : from_float<T>(0.0f);
  }
};

// ---- dtype dispatch and conversion -------------------------------------------

using detail::Tag;

// Calls fn(Tag<T>{}) with T the device type of `dtype`.
template <typename Fn>
void dispatch_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::f32:
      return fn(Tag<float>{});
    case DType::bf16:
      return fn(Tag<__nv_bfloat16>{});
    case DType::f16:
      return fn(Tag<__half>{});
    case DType::i32:
      return fn(Tag<int32_t>{});
    case DType::i64:
      return fn(Tag<int64_t>{});
    case DType::u8:
      return fn(Tag<uint8_t>{});
  }
  DDP_ASSERT(false, "unknown dtype {}", static_cast<int>(dtype));
}

// Like the CPU kernels: 16-bit floats go through f32 (round to nearest even on the
// way down), everything else is a static_cast (float -> int truncates).
template <typename Dst, typename Src>
__device__ __forceinline__ Dst convert(Src v) {
  if constexpr (std::is_same_v<Src, __nv_bfloat16>) {
    return convert<Dst>(__bfloat162float(v));
  } else if constexpr (std::is_same_v<Src, __half>) {
    return convert<Dst>(__half2float(v));
  } else if constexpr (std::is_same_v<Dst, __nv_bfloat16>) {
    return __float2bfloat16_rn(static_cast<float>(v));
  } else if constexpr (std::is_same_v<Dst, __half>) {
    return __float2half_rn(static_cast<float>(v));
  } else {
    return static_cast<Dst>(v);
  }
}

template <typename Src, typename Dst>
struct CastFn {
  __device__ Dst operator()(Src src) const { return convert<Dst>(src); }
};

template <typename T>
struct FillFn {
  T value;
  __device__ T operator()() const { return value; }
};

template <typename T>
void launch_fill(Tensor& t, T value) {
  map_elements("fill", t, t.numel(), FillFn<T>{value}, ptr<T>(t));
}

template <typename T>
struct ArangeFn {
  T* out;
  double start;
  double step;
  __device__ void operator()(int64_t i) const {
    // Explicit rounding stops nvcc from contracting into an fma, so the values
    // match the CPU's `start + i * step` exactly.
    out[i] = convert<T>(__dadd_rn(start, __dmul_rn(static_cast<double>(i), step)));
  }
};

}  // namespace

void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  switch (op) {
    case BinaryOp::add:
      return launch_binary<BinaryOp::add>(a, b, out);
    case BinaryOp::sub:
      return launch_binary<BinaryOp::sub>(a, b, out);
    case BinaryOp::mul:
      return launch_binary<BinaryOp::mul>(a, b, out);
    case BinaryOp::bce_logits:
      return launch_binary<BinaryOp::bce_logits>(a, b, out);
    case BinaryOp::bce_logits_grad:
      return launch_binary<BinaryOp::bce_logits_grad>(a, b, out);
  }
  DDP_ASSERT(false, "unknown BinaryOp {}", static_cast<int>(op));
}

void scale(const Tensor& a, float s, Tensor& out) {
  dispatch_float(a.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    map_elements("scale", out, out.numel(), ScaleFn<T>{s}, ptr<T>(out), ptr<const T>(a));
  });
}

void broadcast_scalar(const Tensor& scalar, Tensor& out) {
  const BroadcastScalarFn fn{ptr<const float>(scalar), ptr<float>(out)};
  for_each_index(out, out.numel(), fn, "broadcast_scalar");
}

void axpy(float alpha, const Tensor& x, Tensor& y) {
  map_elements("axpy", y, y.numel(), AxpyFn{alpha}, ptr<float>(y), ptr<const float>(x),
               ptr<const float>(y));
}

void add_bias_rows(const Tensor& x, const Tensor& bias, Tensor& out) {
  const int64_t cols = bias.numel();
  if (cols == 0) return;  // then out is empty too
  dispatch_float(x.dtype(), [&](auto x_tag) {
    using X = typename decltype(x_tag)::type;
    dispatch_float(bias.dtype(), [&](auto bias_tag) {
      using Bias = typename decltype(bias_tag)::type;
      dispatch_float(out.dtype(), [&](auto out_tag) {
        using Out = typename decltype(out_tag)::type;
        const AddBiasRowsFn<X, Bias, Out> fn{ptr<const X>(x), ptr<const Bias>(bias), cols,
                                             ptr<Out>(out)};
        for_each_index(out, out.numel(), fn, "add_bias_rows");
      });
    });
  });
}

void unary(UnaryOp op, const Tensor& x, Tensor& out) {
  dispatch_float(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    map_elements("unary", out, out.numel(), UnaryFn<T>{static_cast<int>(op)}, ptr<T>(out),
                 ptr<const T>(x));
  });
}

void unary_backward(UnaryOp op, const Tensor& grad, const Tensor& x, Tensor& out) {
  dispatch_float(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    map_elements("unary_backward", out, out.numel(), UnaryBackwardFn<T>{static_cast<int>(op)},
                 ptr<T>(out), ptr<const T>(grad), ptr<const T>(x));
  });
}

void relu(const Tensor& x, Tensor& out) {
  dispatch_float(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    map_elements("relu", out, out.numel(), ReluFn<T>{}, ptr<T>(out), ptr<const T>(x));
  });
}

void relu_backward(const Tensor& grad, const Tensor& x, Tensor& out) {
  dispatch_float(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    map_elements("relu_backward", out, out.numel(), ReluBackwardFn<T>{}, ptr<T>(out),
                 ptr<const T>(grad), ptr<const T>(x));
  });
}

void cast(const Tensor& src, Tensor& dst) {
  DDP_ASSERT(src.numel() == dst.numel(), "cast of {} elements into {}", src.numel(), dst.numel());
  dispatch_dtype(src.dtype(), [&](auto src_tag) {
    using Src = typename decltype(src_tag)::type;
    dispatch_dtype(dst.dtype(), [&](auto dst_tag) {
      using Dst = typename decltype(dst_tag)::type;
      map_elements("cast", dst, dst.numel(), CastFn<Src, Dst>{}, ptr<Dst>(dst),
                   ptr<const Src>(src));
    });
  });
}

void fill(Tensor& t, double value) {
  // The value is converted once on the host, with the same functions as the CPU
  // kernels, so both devices store identical bits.
  const auto f = static_cast<float>(value);
  switch (t.dtype()) {
    case DType::f32:
      return launch_fill<float>(t, f);
    case DType::bf16:
      return launch_fill<uint16_t>(t, float_to_bf16(f));
    case DType::f16:
      return launch_fill<uint16_t>(t, float_to_f16(f));
    case DType::i32:
      return launch_fill<int32_t>(t, static_cast<int32_t>(value));
    case DType::i64:
      return launch_fill<int64_t>(t, static_cast<int64_t>(value));
    case DType::u8:
      return launch_fill<uint8_t>(t, static_cast<uint8_t>(value));
  }
  DDP_ASSERT(false, "unknown dtype {}", static_cast<int>(t.dtype()));
}

void arange(Tensor& t, double start, double step) {
  dispatch_dtype(t.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    for_each_index(t, t.numel(), ArangeFn<T>{ptr<T>(t), start, step}, "arange");
  });
}

}  // namespace ddp::kernels::cuda
