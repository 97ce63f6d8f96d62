// The fused classifier on CUDA (Note [fused classifier] in ops/ops.h): softmax +
// cross-entropy over 16-bit logits [N, C] keeping only each row's log-sum-exp, and
// its backward recomputing the probabilities from the logits. The per-element maths
// is ops/mixed_math.h's, which the CPU kernels (ops/cpu/reduce.cpp) run too.
//
// Forward, one block per row (grid-stride over rows): each thread folds its columns
// into online softmax statistics (max, sum of exp(x - max)), reading the row in
// 16-byte vectors as Note [vectorized rows] in vec_map.h cuts it (GPT-2's 50257
// columns start most rows mid-vector); the block merges them by a fixed tree (so
// the bits never depend on timing or on the layout), and thread 0 writes lse = max + log(sum) and
// the row's loss lse - x[label] (NaN for a label outside [0, C)). One read of the logits: N*C*2
// bytes, ~2 exp per element. A second one-block kernel takes the mean of the row losses in double.
// Backward, one block per row: grad = grad_loss / N * (exp(x - lse) - onehot) in the
// logits' dtype: N*C*2 bytes read and written, one exp per element.
#include "runtime/ops/cuda/launch.cuh"  // first (see its top)

#include "runtime/ops/cuda/float_types.cuh"
#include "runtime/ops/cuda/row_reduce.cuh"
#include "runtime/ops/kernels.h"
#include "runtime/ops/mixed_math.h"

#include <math_constants.h>

namespace ddp::kernels::cuda {
namespace {

using detail::dispatch_float;
using detail::from_float;
using detail::kFullMask;
using detail::kThreads;
using detail::kWarp;
using detail::kWarps;
using detail::ptr;
using detail::row_blocks;
using detail::stream_of;
using detail::to_float;
using math::SoftmaxStats;

// The block's merged statistics, valid in every thread (Note [row reduce]'s order:
// an xor butterfly in each warp, then the warps in order).
__device__ SoftmaxStats block_all_stats(SoftmaxStats s) {
  __shared__ SoftmaxStats warp_stats[kWarps];
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    const SoftmaxStats other{__shfl_xor_sync(kFullMask, s.max, offset),
                             __shfl_xor_sync(kFullMask, s.sum, offset)};
    s = math::softmax_stats_merge(s, other);
  }
  if (threadIdx.x % kWarp == 0) warp_stats[threadIdx.x / kWarp] = s;
  __syncthreads();
  SoftmaxStats result = warp_stats[0];
  for (int w = 1; w < kWarps; ++w) result = math::softmax_stats_merge(result, warp_stats[w]);
  __syncthreads();  // the next row overwrites warp_stats
  return result;
}

// Elements per vector of the row kernels: 16 bytes of T (Note [vectorized rows]).
template <typename T>
constexpr int kRowVector = vec::widest_map<T>();

// whole: the logits' base is aligned for a vector (Note [vectorized rows]).
template <typename T>
__global__ void xent_lse_rows_kernel(const T* logits, const int64_t* labels, int64_t rows,
                                     int64_t cols, bool whole, float* lse, float* row_loss) {
  constexpr int V = kRowVector<T>;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* x = logits + r * cols;
    SoftmaxStats s{-CUDART_INF_F, 0.0f};
    vec::row_thread<V>(
        x, r * cols, cols, whole, threadIdx.x, blockDim.x,
        [&](int64_t j) { s = math::softmax_stats_add(s, to_float(x[j])); },
        [&](int64_t, const vec::Pack<T, V>& p) {
#pragma unroll
          for (int e = 0; e < V; ++e) s = math::softmax_stats_add(s, to_float(p.v[e]));
        });
    s = block_all_stats(s);
    if (threadIdx.x == 0) {
      const float row_lse = s.max + logf(s.sum);
      const int64_t label = labels[r];
      lse[r] = row_lse;
      row_loss[r] = (label < 0 || label >= cols) ? CUDART_NAN_F : row_lse - to_float(x[label]);
    }
  }
}

// out[0] = mean of the n row losses, summed in double by one block.
__global__ void mean_kernel(const float* row_loss, int64_t n, float* out) {
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += row_loss[i];
  acc = detail::block_all_sum(acc);
  if (threadIdx.x == 0) out[0] = static_cast<float>(acc / static_cast<double>(n));
}

// whole: the logits' and grad's bases are aligned for a vector (Note [vectorized
// rows]); grad may be the logits (in place).
template <typename T>
__global__ void xent_lse_backward_kernel(const T* logits, const float* lse, const int64_t* labels,
                                         const float* grad_loss, int64_t rows, int64_t cols,
                                         bool whole, T* grad) {
  constexpr int V = kRowVector<T>;
  // Read on the device: the backward never waits for the host.
  const float scale = grad_loss[0] / static_cast<float>(rows);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* x = logits + r * cols;
    T* g = grad + r * cols;
    const float row_lse = lse[r];
    const int64_t label = labels[r];
    vec::row_thread<V>(
        x, r * cols, cols, whole, threadIdx.x, blockDim.x,
        [&](int64_t j) {
          g[j] = from_float<T>(math::xent_grad(to_float(x[j]), row_lse, j == label, scale));
        },
        [&](int64_t j0, const vec::Pack<T, V>& p) {
          vec::Pack<T, V> out;
#pragma unroll
          for (int e = 0; e < V; ++e) {
            out.v[e] =
                from_float<T>(math::xent_grad(to_float(p.v[e]), row_lse, j0 + e == label, scale));
          }
          vec::store_at<V>(g + j0, out, whole);
        });
  }
}

}  // namespace

void softmax_xent_lse_forward(const Tensor& logits, const Tensor& labels, Tensor& loss,
                              Tensor& lse) {
  const int64_t rows = logits.size(0), cols = logits.size(1);
  cuda_api::DeviceGuard guard(logits.device().index);
  const cudaStream_t stream = stream_of(logits);
  const Tensor row_loss = empty({rows}, {.dtype = DType::f32, .device = logits.device()});
  dispatch_float(logits.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const bool whole = vec::aligned_for<kRowVector<T>>(ptr<const T>(logits));
    xent_lse_rows_kernel<T><<<row_blocks(rows), kThreads, 0, stream>>>(
        ptr<const T>(logits), ptr<const int64_t>(labels), rows, cols, whole, ptr<float>(lse),
        ptr<float>(row_loss));
  });
  cuda_api::check_last_error("xent_lse_rows_kernel");
  mean_kernel<<<1, kThreads, 0, stream>>>(ptr<const float>(row_loss), rows, ptr<float>(loss));
  cuda_api::check_last_error("mean_kernel");
}

void softmax_xent_lse_backward(const Tensor& logits, const Tensor& lse, const Tensor& labels,
                               const Tensor& grad_loss, Tensor& grad_logits) {
  const int64_t rows = logits.size(0), cols = logits.size(1);
  cuda_api::DeviceGuard guard(logits.device().index);
  dispatch_float(logits.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kV = kRowVector<T>;
    const bool whole = vec::aligned_for<kV>(ptr<const T>(logits)) &&
                       vec::aligned_for<kV>(ptr<const T>(grad_logits));
    xent_lse_backward_kernel<T><<<row_blocks(rows), kThreads, 0, stream_of(grad_logits)>>>(
        ptr<const T>(logits), ptr<const float>(lse), ptr<const int64_t>(labels),
        ptr<const float>(grad_loss), rows, cols, whole, ptr<T>(grad_logits));
  });
  cuda_api::check_last_error("xent_lse_backward_kernel");
}

}  // namespace ddp::kernels::cuda
