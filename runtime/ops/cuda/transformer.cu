// CUDA kernels of the transformer ops: GELU (tanh approximation), LayerNorm over the
// last dim, softmax / log-softmax along the last dim and their backwards, causal
// softmax, and the sum of squares. The math and the order of operations follow the
// CPU kernels (ops/cpu/transformer.cpp, ops/cpu/attention.cpp), with row statistics
// in double as there. Row kernels run one block per row (Note [row reduce] in
// row_reduce.cuh), LayerNorm's in 16-byte vectors (Note [vectorized rows] in
// vec_map.h); GELU is an elementwise map (Note [vectorized elementwise]).
// LayerNorm's weight and bias gradients are column sums with a fixed partition
// (Note [column sums] in column_sum.h). No float atomics anywhere: every result is
// the same bits on every run.
#include "runtime/ops/cuda/launch.cuh"  // first (see its top)

#include "runtime/ops/cuda/column_sum.h"
#include "runtime/ops/cuda/float_types.cuh"
#include "runtime/ops/cuda/row_kernels.h"
#include "runtime/ops/cuda/row_reduce.cuh"
#include "runtime/ops/kernels.h"

#include <cmath>

namespace ddp::kernels::cuda {
namespace {

using detail::block_all_max;
using detail::block_all_sum;
using detail::dispatch_float;
using detail::from_float;
using detail::kThreads;
using detail::ptr;
using detail::row_blocks;
using detail::stream_of;
using detail::to_float;

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

// The last dim of x and the number of rows before it (x viewed as [rows, d]).
struct Rows {
  int64_t rows, d;
};
Rows rows_of(const Tensor& x) {
  const int64_t d = x.size(-1);
  return {d == 0 ? 0 : x.numel() / d, d};
}

// T: float, __nv_bfloat16 or __half; computed in f32, rounded once.
// Both run through map_elements (Note [vectorized elementwise]).
template <typename T>
struct GeluFn {
  __device__ T operator()(T x) const {
    const float v = to_float(x);
    return from_float<T>(0.5f * v * (1.0f + tanhf(kSqrt2OverPi * (v + kGeluCubic * v * v * v))));
  }
};

template <typename T>
struct GeluBackwardFn {
  __device__ T operator()(T grad, T x) const {
    const float v = to_float(x);
    const float t = tanhf(kSqrt2OverPi * (v + kGeluCubic * v * v * v));
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * v * v);
    return from_float<T>(to_float(grad) * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du));
  }
};

// The row kernels of LayerNorm read and write their [rows, d] arrays in vectors of
// kNormVector elements (16 bytes of f32), each row cut by Note [vectorized rows] in
// vec_map.h: one 16-byte access per vector where every array's base allows
// (`whole`, norm_whole below), else the vector's elements one by one. All the arrays
// of one call share each row's cut, so a thread reads of each exactly the elements
// it reads of the others, and the reductions' order depends only on (d, r): the same
// bits whatever the layout, run to run.
constexpr int kNormVector = 4;

// Whether arrays of [rows, d] elements at these bases allow whole vectors.
template <typename... T>
bool norm_whole(const T*... p) {
  return (vec::aligned_for<kNormVector>(p) && ...);
}

// One row (row r: `first` = r * d) of layer_norm for the calling block: two passes
// over src, as the CPU: var = E[(x - mu)^2] does not cancel. Out: the output's type
// (bf16 under autocast: Note [autocast]), each element rounded once. A thread reads of
// src only the elements its cut hands it (Note [vectorized rows]), so src may be
// what the same thread has just written through the same cut.
template <typename Out>
__device__ void norm_row(const float* src, int64_t first, bool whole, const float* w,
                         const float* b, float eps, int64_t d, Out* dst, float* mean, float* rstd) {
  constexpr int V = kNormVector;
  const int64_t t = threadIdx.x, threads = blockDim.x;
  double sum = 0.0;
  vec::row_thread<V>(
      src, first, d, whole, t, threads, [&](int64_t j) { sum += src[j]; },
      [&](int64_t, const vec::Pack<float, V>& p) {
#pragma unroll
        for (int e = 0; e < V; ++e) sum += p.v[e];
      });
  const double mu = block_all_sum(sum) / static_cast<double>(d);
  double sq = 0.0;
  vec::row_thread<V>(
      src, first, d, whole, t, threads,
      [&](int64_t j) {
        const double c = src[j] - mu;
        sq += c * c;
      },
      [&](int64_t, const vec::Pack<float, V>& p) {
#pragma unroll
        for (int e = 0; e < V; ++e) {
          const double c = p.v[e] - mu;
          sq += c * c;
        }
      });
  sq = block_all_sum(sq);
  const auto inv = static_cast<float>(1.0 / sqrt(sq / static_cast<double>(d) + eps));
  const auto m = static_cast<float>(mu);
  vec::row_thread<V>(
      src, first, d, whole, t, threads,
      [&](int64_t j) { dst[j] = from_float<Out>((src[j] - m) * inv * w[j] + b[j]); },
      [&](int64_t j0, const vec::Pack<float, V>& p) {
        vec::Pack<Out, V> o;
#pragma unroll
        for (int e = 0; e < V; ++e) {
          o.v[e] = from_float<Out>((p.v[e] - m) * inv * w[j0 + e] + b[j0 + e]);
        }
        vec::store_at<V>(dst + j0, o, whole);
      });
  if (threadIdx.x == 0) {
    *mean = m;
    *rstd = inv;
  }
}

// whole: norm_whole of x and out.
template <typename Out>
__global__ void layer_norm_kernel(const float* x, const float* w, const float* b, float eps,
                                  int64_t rows, int64_t d, bool whole, Out* out, float* mean,
                                  float* rstd) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    norm_row(x + r * d, r * d, whole, w, b, eps, d, out + r * d, mean + r, rstd + r);
  }
}

// sum = x + y, rounded to f32 as the binary add rounds it, then norm_row over the
// row of sum each thread has just written (Note [residual layer norm]). whole:
// norm_whole of x, y, sum and out.
template <typename Y, typename Out>
__global__ void residual_layer_norm_kernel(const float* x, const Y* y, const float* w,
                                           const float* b, float eps, int64_t rows, int64_t d,
                                           bool whole, float* sum, Out* out, float* mean,
                                           float* rstd) {
  constexpr int V = kNormVector;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    float* s = sum + r * d;
    const float* xr = x + r * d;
    const Y* yr = y + r * d;
    vec::row_thread<V>(
        xr, r * d, d, whole, threadIdx.x, blockDim.x,
        [&](int64_t j) { s[j] = xr[j] + to_float(yr[j]); },
        [&](int64_t j0, const vec::Pack<float, V>& p) {
          const vec::Pack<Y, V> q = vec::load_at<V>(yr + j0, whole);
          vec::Pack<float, V> o;
#pragma unroll
          for (int e = 0; e < V; ++e) o.v[e] = p.v[e] + to_float(q.v[e]);
          vec::store_at<V>(s + j0, o, whole);
        });
    norm_row(s, r * d, whole, w, b, eps, d, out + r * d, mean + r, rstd + r);
  }
}

// grad_x = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)), dxhat = grad * weight.
// G: the incoming gradient's type (bf16 under autocast), read as f32. whole:
// norm_whole of grad, x and grad_x. accumulate: grad_x's old value w becomes w + the
// gradient, in one rounded add (__fadd_rn: never fused into the product before it,
// so the bits are add(w, gradient)'s; Note [accumulating into a pending gradient]).
template <typename G>
__global__ void layer_norm_grad_x_kernel(const G* grad, const float* x, const float* mean,
                                         const float* rstd, const float* w, int64_t rows, int64_t d,
                                         bool whole, bool accumulate, float* grad_x) {
  constexpr int V = kNormVector;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const G* g = grad + r * d;
    const float* src = x + r * d;
    float* gx = grad_x + r * d;
    const float mu = mean[r], inv = rstd[r];
    double sum_dxhat = 0.0, sum_dxhat_xhat = 0.0;
    const auto add = [&](float xv, G gv, float wv) {
      const float xhat = (xv - mu) * inv;
      const float dxhat = __fmul_rn(to_float(gv), wv);  // never fused: the sums and the
      sum_dxhat += dxhat;                               // second pass use the same product
      sum_dxhat_xhat += static_cast<double>(dxhat) * xhat;
    };
    vec::row_thread<V>(
        src, r * d, d, whole, threadIdx.x, blockDim.x, [&](int64_t j) { add(src[j], g[j], w[j]); },
        [&](int64_t j0, const vec::Pack<float, V>& p) {
          const vec::Pack<G, V> q = vec::load_at<V>(g + j0, whole);
#pragma unroll
          for (int e = 0; e < V; ++e) add(p.v[e], q.v[e], w[j0 + e]);
        });
    const auto mean_dxhat = static_cast<float>(block_all_sum(sum_dxhat) / static_cast<double>(d));
    const auto mean_dxhat_xhat =
        static_cast<float>(block_all_sum(sum_dxhat_xhat) / static_cast<double>(d));
    const auto one = [&](float xv, G gv, float wv) {
      const float xhat = (xv - mu) * inv;
      return inv * (__fmul_rn(to_float(gv), wv) - mean_dxhat - xhat * mean_dxhat_xhat);
    };
    vec::row_thread<V>(
        src, r * d, d, whole, threadIdx.x, blockDim.x,
        [&](int64_t j) {
          const float v = one(src[j], g[j], w[j]);
          gx[j] = accumulate ? __fadd_rn(gx[j], v) : v;
        },
        [&](int64_t j0, const vec::Pack<float, V>& p) {
          const vec::Pack<G, V> q = vec::load_at<V>(g + j0, whole);
          vec::Pack<float, V> o;
#pragma unroll
          for (int e = 0; e < V; ++e) o.v[e] = one(p.v[e], q.v[e], w[j0 + e]);
          if (accumulate) {
            const vec::Pack<float, V> before = vec::load_at<V>(gx + j0, whole);
#pragma unroll
            for (int e = 0; e < V; ++e) o.v[e] = __fadd_rn(before.v[e], o.v[e]);
          }
          vec::store_at<V>(gx + j0, o, whole);
        });
  }
}

// Pass 1 of Note [column sums]: partials [chunks, d] of sum(grad xhat) and sum(grad).
template <typename G>
__global__ void layer_norm_column_partials_kernel(const G* grad, const float* x, const float* mean,
                                                  const float* rstd, int64_t rows, int64_t d,
                                                  column_sum::Plan plan, double* partial_w,
                                                  double* partial_b) {
  __shared__ double sum_w[column_sum::kBlockThreads], sum_b[column_sum::kBlockThreads];
  const int t = static_cast<int>(threadIdx.x);
  const int tx = t % column_sum::kColThreads, ty = t / column_sum::kColThreads;
  // `tile` is the same for the whole block, so every thread reaches each barrier.
  for (int64_t tile = blockIdx.x; tile < plan.tiles(); tile += gridDim.x) {
    const column_sum::Tile at = column_sum::tile_at(plan, tile);
    const int64_t col = at.col0 + tx;
    double acc_w = 0.0, acc_b = 0.0;
    if (col < d) {
      const column_sum::RowSpan span = column_sum::thread_rows(at, ty, rows);
      for (int64_t r = span.first; r < span.end; r += span.step) {
        const float g = to_float(grad[r * d + col]);
        const float xhat = (x[r * d + col] - mean[r]) * rstd[r];
        acc_w += static_cast<double>(g) * xhat;
        acc_b += g;
      }
    }
    sum_w[t] = acc_w;
    sum_b[t] = acc_b;
    __syncthreads();
    for (int stride = column_sum::kRowThreads / 2; stride > 0; stride /= 2) {
      if (ty < stride) {
        sum_w[t] += sum_w[t + stride * column_sum::kColThreads];
        sum_b[t] += sum_b[t + stride * column_sum::kColThreads];
      }
      __syncthreads();
    }
    if (ty == 0 && col < d) {
      partial_w[column_sum::partial_index(at.chunk, col, d)] = sum_w[t];
      partial_b[column_sum::partial_index(at.chunk, col, d)] = sum_b[t];
    }
    __syncthreads();  // the next tile overwrites sum_w and sum_b
  }
}

// Pass 2 of Note [column sums]: each column's partials in chunk order.
struct ColumnFinishFn {
  const double* partial_w;
  const double* partial_b;
  int64_t chunks, d;
  float* grad_w;
  float* grad_b;
  __device__ void operator()(int64_t col) const {
    double w = 0.0, b = 0.0;
    for (int64_t c = 0; c < chunks; ++c) {
      w += partial_w[column_sum::partial_index(c, col, d)];
      b += partial_b[column_sum::partial_index(c, col, d)];
    }
    grad_w[col] = static_cast<float>(w);
    grad_b[col] = static_cast<float>(b);
  }
};

// Softmax (or log-softmax) of src[0, d) into dst[0, d) by the whole block; d >= 1.
// dst may be src: each element is read and written by one thread, after the last
// reduction's barrier. The row maximum is subtracted first, and the sum is in double.
__device__ void softmax_row(const float* src, int64_t d, bool log, float* dst) {
  float max = -INFINITY;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) max = fmaxf(max, src[j]);
  max = block_all_max(max);
  double sum = 0.0;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
    sum += exp(static_cast<double>(src[j] - max));
  sum = block_all_sum(sum);
  if (log) {
    const auto log_sum = static_cast<float>(::log(sum));
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) dst[j] = src[j] - max - log_sum;
  } else {
    const auto inv = static_cast<float>(1.0 / sum);
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) dst[j] = expf(src[j] - max) * inv;
  }
}

__global__ void softmax_kernel(const float* x, int64_t rows, int64_t d, bool log, float* out) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x)
    softmax_row(x + r * d, d, log, out + r * d);
}

// Row r is row i = r % t of its [t, t] matrix: columns 0..i, exact zeros after.
__global__ void causal_softmax_kernel(const float* x, int64_t rows, int64_t t, float* out) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t seen = r % t + 1;
    float* dst = out + r * t;
    softmax_row(x + r * t, seen, false, dst);
    for (int64_t j = seen + threadIdx.x; j < t; j += blockDim.x) dst[j] = 0.0f;
  }
}

// grad_x may be grad (in place), as in softmax_row.
__global__ void softmax_backward_kernel(const float* grad, const float* y, int64_t rows, int64_t d,
                                        bool log, float* grad_x) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* g = grad + r * d;
    const float* out = y + r * d;
    float* dst = grad_x + r * d;
    double acc = 0.0;  // softmax: sum(grad y); log-softmax: sum(grad)
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      acc += log ? static_cast<double>(g[j]) : static_cast<double>(g[j]) * out[j];
    }
    const auto s = static_cast<float>(block_all_sum(acc));
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      dst[j] = log ? g[j] - expf(out[j]) * s : out[j] * (g[j] - s);
    }
  }
}

// sum_squares in two passes with a grid that depends only on n (Note [deterministic
// sum] in reduce.cu): per-block partials in double, then one block over them.
constexpr int64_t kSquaresPerThread = 8;
constexpr int64_t kMaxSquarePartials = 1024;

__global__ void square_partials_kernel(const float* x, int64_t n, double* partials) {
  double acc = 0.0;
  for (int64_t i = detail::global_thread(); i < n; i += detail::grid_threads()) {
    acc += static_cast<double>(x[i]) * x[i];
  }
  acc = block_all_sum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

__global__ void sum_partials_kernel(const double* partials, int64_t count, float* out) {
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) acc += partials[i];
  acc = block_all_sum(acc);
  if (threadIdx.x == 0) out[0] = static_cast<float>(acc);
}

// A device tensor of `count` doubles from the caching allocator (ddp has no f64
// dtype; i64 has the size and alignment). Freed by the caller while kernels that use
// it may still run: its next user is ordered after them on the same stream.
Tensor double_scratch(int64_t count, const Tensor& on) {
  static_assert(sizeof(double) == sizeof(int64_t));
  return empty({count}, {.dtype = DType::i64, .device = on.device()});
}

// G: the incoming gradient's element type.
template <typename G>
void layer_norm_backward_typed(const Tensor& grad, const Tensor& x, const Tensor& mean,
                               const Tensor& rstd, const Tensor& weight, Tensor& grad_x,
                               Tensor& grad_weight, Tensor& grad_bias, bool accumulate) {
  const auto [rows, d] = rows_of(x);
  cuda_api::DeviceGuard guard(grad_x.device().index);
  const cudaStream_t stream = stream_of(grad_x);
  if (rows > 0) {
    const bool whole =
        norm_whole(ptr<const G>(grad), ptr<const float>(x), ptr<const float>(grad_x));
    layer_norm_grad_x_kernel<G><<<row_blocks(rows), kThreads, 0, stream>>>(
        ptr<const G>(grad), ptr<const float>(x), ptr<const float>(mean), ptr<const float>(rstd),
        ptr<const float>(weight), rows, d, whole, accumulate, ptr<float>(grad_x));
    cuda_api::check_last_error("layer_norm_grad_x_kernel");
  }
  const column_sum::Plan plan = column_sum::make_plan(rows, d);
  const Tensor partial_w = double_scratch(plan.chunks * d, grad_x);
  const Tensor partial_b = double_scratch(plan.chunks * d, grad_x);
  const int blocks = static_cast<int>(std::min(plan.tiles(), detail::kMaxBlocks));
  layer_norm_column_partials_kernel<G><<<blocks, column_sum::kBlockThreads, 0, stream>>>(
      ptr<const G>(grad), ptr<const float>(x), ptr<const float>(mean), ptr<const float>(rstd), rows,
      d, plan, ptr<double>(partial_w), ptr<double>(partial_b));
  cuda_api::check_last_error("layer_norm_column_partials_kernel");
  const ColumnFinishFn finish{
      ptr<const double>(partial_w), ptr<const double>(partial_b), plan.chunks, d,
      ptr<float>(grad_weight),      ptr<float>(grad_bias)};
  detail::for_each_index(grad_weight, d, finish, "layer_norm_backward (weight and bias)");
}

}  // namespace

void gelu(const Tensor& x, Tensor& out) {
  dispatch_float(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    detail::map_elements("gelu", out, out.numel(), GeluFn<T>{}, ptr<T>(out), ptr<const T>(x));
  });
}

void gelu_backward(const Tensor& grad, const Tensor& x, Tensor& out) {
  dispatch_float(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    detail::map_elements("gelu_backward", out, out.numel(), GeluBackwardFn<T>{}, ptr<T>(out),
                         ptr<const T>(grad), ptr<const T>(x));
  });
}

void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps, Tensor& out,
                Tensor& mean, Tensor& rstd) {
  const auto [rows, d] = rows_of(x);
  if (rows == 0) return;
  cuda_api::DeviceGuard guard(out.device().index);
  dispatch_float(out.dtype(), [&](auto tag) {
    using Out = typename decltype(tag)::type;
    const bool whole = norm_whole(ptr<const float>(x), ptr<const Out>(out));
    layer_norm_kernel<Out><<<row_blocks(rows), kThreads, 0, stream_of(out)>>>(
        ptr<const float>(x), ptr<const float>(weight), ptr<const float>(bias), eps, rows, d, whole,
        ptr<Out>(out), ptr<float>(mean), ptr<float>(rstd));
  });
  cuda_api::check_last_error("layer_norm_kernel");
}

void residual_layer_norm(const Tensor& x, const Tensor& y, const Tensor& weight, const Tensor& bias,
                         float eps, Tensor& sum, Tensor& out, Tensor& mean, Tensor& rstd) {
  const auto [rows, d] = rows_of(x);
  if (rows == 0) return;
  cuda_api::DeviceGuard guard(out.device().index);
  dispatch_float(y.dtype(), [&](auto y_tag) {
    using Y = typename decltype(y_tag)::type;
    dispatch_float(out.dtype(), [&](auto out_tag) {
      using Out = typename decltype(out_tag)::type;
      const bool whole = norm_whole(ptr<const float>(x), ptr<const Y>(y), ptr<const float>(sum),
                                    ptr<const Out>(out));
      residual_layer_norm_kernel<Y, Out><<<row_blocks(rows), kThreads, 0, stream_of(out)>>>(
          ptr<const float>(x), ptr<const Y>(y), ptr<const float>(weight), ptr<const float>(bias),
          eps, rows, d, whole, ptr<float>(sum), ptr<Out>(out), ptr<float>(mean), ptr<float>(rstd));
    });
  });
  cuda_api::check_last_error("residual_layer_norm_kernel");
}

void layer_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& mean,
                         const Tensor& rstd, const Tensor& weight, Tensor& grad_x,
                         Tensor& grad_weight, Tensor& grad_bias, bool accumulate) {
  dispatch_float(grad.dtype(), [&](auto tag) {
    using G = typename decltype(tag)::type;
    layer_norm_backward_typed<G>(grad, x, mean, rstd, weight, grad_x, grad_weight, grad_bias,
                                 accumulate);
  });
}

void softmax(const Tensor& x, bool log, Tensor& out) {
  const auto [rows, d] = rows_of(x);
  if (rows == 0) return;
  cuda_api::DeviceGuard guard(out.device().index);
  softmax_kernel<<<row_blocks(rows), kThreads, 0, stream_of(out)>>>(ptr<const float>(x), rows, d,
                                                                    log, ptr<float>(out));
  cuda_api::check_last_error("softmax_kernel");
}

namespace detail {

void launch_causal_softmax(const Tensor& on, const float* x, int64_t rows, int64_t t, float* out) {
  if (rows == 0) return;
  cuda_api::DeviceGuard guard(on.device().index);
  causal_softmax_kernel<<<row_blocks(rows), kThreads, 0, stream_of(on)>>>(x, rows, t, out);
  cuda_api::check_last_error("causal_softmax_kernel");
}

void launch_softmax_backward(const Tensor& on, const float* grad, const float* y, int64_t rows,
                             int64_t d, bool log, float* grad_x) {
  if (rows == 0) return;
  cuda_api::DeviceGuard guard(on.device().index);
  softmax_backward_kernel<<<row_blocks(rows), kThreads, 0, stream_of(on)>>>(grad, y, rows, d, log,
                                                                            grad_x);
  cuda_api::check_last_error("softmax_backward_kernel");
}

}  // namespace detail

void softmax_backward(const Tensor& grad, const Tensor& y, bool log, Tensor& grad_x) {
  const auto [rows, d] = rows_of(y);
  detail::launch_softmax_backward(grad_x, ptr<const float>(grad), ptr<const float>(y), rows, d, log,
                                  ptr<float>(grad_x));
}

void causal_softmax(const Tensor& x, Tensor& out) {
  const auto [rows, t] = rows_of(x);
  detail::launch_causal_softmax(out, ptr<const float>(x), rows, t, ptr<float>(out));
}

void sum_squares(const Tensor& x, Tensor& out) {
  const int64_t n = x.numel();
  cuda_api::DeviceGuard guard(out.device().index);
  const cudaStream_t stream = stream_of(out);
  const int64_t per_block = kThreads * kSquaresPerThread;
  const int64_t blocks =
      std::clamp<int64_t>((n + per_block - 1) / per_block, 1, kMaxSquarePartials);
  const Tensor partials = double_scratch(blocks, out);
  square_partials_kernel<<<static_cast<int>(blocks), kThreads, 0, stream>>>(ptr<const float>(x), n,
                                                                            ptr<double>(partials));
  cuda_api::check_last_error("square_partials_kernel");
  sum_partials_kernel<<<1, kThreads, 0, stream>>>(ptr<const double>(partials), blocks,
                                                  ptr<float>(out));
  cuda_api::check_last_error("sum_partials_kernel");
}

}  // namespace ddp::kernels::cuda
