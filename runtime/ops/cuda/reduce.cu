// Reductions on CUDA: sums, argmax, and the fused softmax + cross-entropy.
//
// Note [deterministic sum]: a full sum runs in at most two passes with a grid
// that depends only on the element count (launch.cuh's fixed caps): per-block
// partials, each a fixed tree of warp shuffles, then one block over the partials.
// No atomics, so the same input gives the same bits on every run and every GPU.
// Threads and trees add in double (the CPU sums in double too); the traffic, not
// the arithmetic, bounds the speed. Sums and argmax along one dimension follow
// the same rules with a block tree per output (Note [dim reduce] in dim_reduce.h).
#include "runtime/ops/cuda/launch.cuh"  // first (see its top)

#include "runtime/ops/cuda/dim_reduce.h"
#include "runtime/ops/cuda/float_types.cuh"
#include "runtime/ops/kernels.h"

#include <math_constants.h>

#include <cmath>
#include <limits>
#include <type_traits>

namespace ddp::kernels::cuda {
namespace {

using detail::global_thread;
using detail::grid_threads;
using detail::kThreads;
using detail::ptr;
using detail::stream_of;

constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;
static_assert(kThreads % kWarp == 0 && kThreads / kWarp <= kWarp, "block_sum needs whole warps");
// First-pass blocks of a full sum; elements per thread before a second pass pays.
constexpr int64_t kMaxPartials = 1024;
constexpr int64_t kSumPerThread = 8;

// Butterfly (xor) reductions: every lane ends with the result.
template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
  }
  return v;
}

// Sum over a block of kThreads threads; the result is valid in thread 0. Called
// once per kernel (it reuses one shared array without a trailing barrier).
__device__ double block_sum(double v) {
  __shared__ double warp_sums[kThreads / kWarp];
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  v = warp_sum(v);
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kThreads / kWarp ? warp_sums[lane] : 0.0;
    v = warp_sum(v);
  }
  return v;
}

// Pass 1 of Note [deterministic sum]: partials[block] = sum of the block's stride.
__global__ void partial_sums_kernel(const float* x, int64_t n, float* partials) {
  double acc = 0.0;
  for (int64_t i = global_thread(); i < n; i += grid_threads()) acc += x[i];
  acc = block_sum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = static_cast<float>(acc);
}

// Pass 2 (or the only pass for small n): one block, out[0] = scale * sum(x[0, n)).
__global__ void final_sum_kernel(const float* x, int64_t n, float scale, float* out) {
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += x[i];
  acc = block_sum(acc);
  if (threadIdx.x == 0) out[0] = static_cast<float>(acc) * scale;
}

// out[0] = scale * sum(x[0, n)) on `on`'s device and current stream.
void reduce_sum(const Tensor& on, const float* x, int64_t n, float scale, float* out) {
  cuda_api::DeviceGuard guard(on.device().index);
  const cudaStream_t stream = stream_of(on);
  const int64_t per_block = kThreads * kSumPerThread;
  const int64_t blocks = std::min((n + per_block - 1) / per_block, kMaxPartials);
  if (blocks <= 1) {
    final_sum_kernel<<<1, kThreads, 0, stream>>>(x, n, scale, out);
    cuda_api::check_last_error("final_sum_kernel");
    return;
  }
  // From the caching allocator, on this stream: freeing it below while the kernels
  // still run is safe because its next user is ordered after them on the stream.
  const Tensor partials = empty({blocks}, {.dtype = DType::f32, .device = on.device()});
  partial_sums_kernel<<<static_cast<int>(blocks), kThreads, 0, stream>>>(x, n,
                                                                         ptr<float>(partials));
  cuda_api::check_last_error("partial_sums_kernel");
  final_sum_kernel<<<1, kThreads, 0, stream>>>(ptr<const float>(partials), blocks, scale, out);
  cuda_api::check_last_error("final_sum_kernel");
}

// One pass of Note [dim reduce] (dim_reduce.h): the tiles of `plan` over x, viewed
// as [outer, n, inner], into out [outer, plan.chunks, inner]: R's partials (Out is
// R::Acc) or, in the last pass, R's results.
template <typename R, typename In, typename Out>
__global__ void dim_reduce_kernel(const In* x, int64_t outer, int64_t n, int64_t inner,
                                  dim_reduce::Plan plan, Out* out) {
  __shared__ typename R::Acc partial[dim_reduce::kBlockThreads];
  const int t = static_cast<int>(threadIdx.x);
  const dim_reduce::Slot slot = dim_reduce::slot_of(plan, t);
  const int64_t tiles = plan.tiles(outer);
  // `base` is the same for the whole block, so every thread reaches each barrier.
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * plan.tz; base < tiles;
       base += static_cast<int64_t>(gridDim.x) * plan.tz) {
    const int64_t tile = base + slot.z;
    const bool active = tile < tiles;
    const dim_reduce::Tile at = dim_reduce::tile_at(plan, active ? tile : 0);
    partial[t] =
        active ? dim_reduce::thread_partial<R>(x, plan, at, slot, n, inner) : R::identity();
    __syncthreads();
    for (int stride = plan.ty / 2; stride > 0; stride /= 2) {
      if (slot.y < stride) partial[t] = R::combine(partial[t], partial[t + stride * plan.tx]);
      __syncthreads();
    }
    const int64_t col = at.col0 + slot.x;
    if (active && slot.y == 0 && col < inner) {
      if constexpr (std::is_same_v<Out, typename R::Acc>) {
        out[dim_reduce::out_index(plan, at, col, inner)] = partial[t];
      } else {
        out[dim_reduce::out_index(plan, at, col, inner)] = R::finish(partial[t]);
      }
    }
    __syncthreads();  // the next round overwrites `partial`
  }
}

template <typename R, typename In, typename Out>
void launch_dim_pass(const In* x, int64_t outer, int64_t n, int64_t inner,
                     const dim_reduce::Plan& plan, Out* out, cudaStream_t stream,
                     const char* name) {
  const int64_t tiles = plan.tiles(outer);
  const int64_t blocks = std::min((tiles + plan.tz - 1) / plan.tz, detail::kMaxBlocks);
  dim_reduce_kernel<R, In, Out><<<static_cast<int>(blocks), dim_reduce::kBlockThreads, 0, stream>>>(
      x, outer, n, inner, plan, out);
  cuda_api::check_last_error(name);
}

// Sum over 16-bit elements too (read as f32, added in double).
struct SumAny : dim_reduce::Sum {
  using dim_reduce::Sum::load;
  template <typename T>
  __host__ __device__ static Acc load(const T* x, int64_t index, int64_t) {
    return detail::to_float(x[index]);
  }
};

// out[o, i] = R over x[o, :, i] (x's elements of type In), in as many passes as Note
// [dim reduce] needs.
template <typename R, typename Out, typename In = float>
void reduce_dim(const Tensor& x, int64_t outer, int64_t n, int64_t inner, Tensor& out,
                const char* name) {
  using Acc = typename R::Acc;
  static_assert(sizeof(Acc) % sizeof(int64_t) == 0, "partials are stored in i64 tensors");
  if (outer == 0 || inner == 0) return;
  cuda_api::DeviceGuard guard(out.device().index);
  const cudaStream_t stream = stream_of(out);
  const In* first = ptr<const In>(x);
  Tensor partials;  // the previous pass's output; see reduce_sum on freeing it early
  for (;;) {
    const dim_reduce::Plan plan = dim_reduce::make_plan(n, inner);
    const Acc* in = partials.defined() ? static_cast<const Acc*>(partials.data_ptr()) : nullptr;
    if (plan.chunks == 1) {
      if (in != nullptr) {
        launch_dim_pass<R>(in, outer, n, inner, plan, ptr<Out>(out), stream, name);
      } else {
        launch_dim_pass<R>(first, outer, n, inner, plan, ptr<Out>(out), stream, name);
      }
      return;
    }
    const int64_t count = outer * plan.chunks * inner;
    Tensor next = empty({count * static_cast<int64_t>(sizeof(Acc) / sizeof(int64_t))},
                        {.dtype = DType::i64, .device = out.device()});
    Acc* next_ptr = static_cast<Acc*>(next.data_ptr());
    if (in != nullptr) {
      launch_dim_pass<R>(in, outer, n, inner, plan, next_ptr, stream, name);
    } else {
      launch_dim_pass<R>(first, outer, n, inner, plan, next_ptr, stream, name);
    }
    partials = std::move(next);
    n = plan.chunks;
  }
}

// One warp per row: max, sum of exp(x - max), probs, and the row's loss
// log(sum) - (x[label] - max); NaN for a label outside [0, cols).
__global__ void softmax_xent_rows_kernel(const float* logits, const int64_t* labels, int64_t rows,
                                         int64_t cols, float* probs, float* row_loss) {
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = grid_threads() / kWarp;
  for (int64_t r = global_thread() / kWarp; r < rows; r += warps) {
    const float* x = logits + r * cols;
    float* p = probs + r * cols;
    float m = -INFINITY;
    for (int64_t j = lane; j < cols; j += kWarp) m = fmaxf(m, x[j]);
    m = warp_max(m);
    float s = 0.0f;
    for (int64_t j = lane; j < cols; j += kWarp) s += expf(x[j] - m);
    s = warp_sum(s);
    for (int64_t j = lane; j < cols; j += kWarp) p[j] = expf(x[j] - m) / s;
    if (lane == 0) {
      const int64_t label = labels[r];
      row_loss[r] = (label < 0 || label >= cols) ? CUDART_NAN_F : logf(s) - (x[label] - m);
    }
  }
}

// grad_logits = grad_loss[0] * (probs - onehot(labels)) / rows. grad_loss is read
// on the device so the backward never waits for the host.
struct SoftmaxXentBackwardFn {
  const float* probs;
  const int64_t* labels;
  const float* grad_loss;
  int64_t rows, cols;
  float* grad_logits;
  __device__ void operator()(int64_t idx) const {
    const int64_t r = idx / cols, j = idx % cols;
    const float onehot = labels[r] == j ? 1.0f : 0.0f;
    // The CPU kernel's order of operations, so both give the same bits.
    const float scale = grad_loss[0] / static_cast<float>(rows);
    grad_logits[idx] = scale * (probs[idx] - onehot);
  }
};

}  // namespace

void sum_all(const Tensor& x, Tensor& out) {
  if (x.dtype() != DType::f32) {  // not on a hot path: widened first
    const Tensor wide = empty(x.shape(), {.dtype = DType::f32, .device = x.device()});
    Tensor w = wide;
    cast(x, w);
    reduce_sum(out, ptr<const float>(w), w.numel(), 1.0f, ptr<float>(out));
    return;
  }
  reduce_sum(out, ptr<const float>(x), x.numel(), 1.0f, ptr<float>(out));
}

void sum_dim(const Tensor& x, int64_t outer, int64_t n, int64_t inner, Tensor& out) {
  detail::dispatch_float(x.dtype(), [&](auto tag) {
    using In = typename decltype(tag)::type;
    reduce_dim<SumAny, float, In>(x, outer, n, inner, out, "sum_dim");
  });
}

void argmax_dim(const Tensor& x, int64_t outer, int64_t n, int64_t inner, Tensor& out) {
  reduce_dim<dim_reduce::Argmax, int64_t>(x, outer, n, inner, out, "argmax_dim");
}

void softmax_xent_forward(const Tensor& logits, const Tensor& labels, Tensor& loss, Tensor& probs) {
  const int64_t rows = logits.size(0), cols = logits.size(1);
  // The mean over no rows is 0/0.
  const float inv_rows =
      rows > 0 ? 1.0f / static_cast<float>(rows) : std::numeric_limits<float>::quiet_NaN();
  if (rows == 0) {
    reduce_sum(loss, nullptr, 0, inv_rows, ptr<float>(loss));
    return;
  }
  const Tensor row_loss = empty({rows}, {.dtype = DType::f32, .device = logits.device()});
  {
    cuda_api::DeviceGuard guard(logits.device().index);
    const int blocks = detail::blocks_for(rows * kWarp);
    softmax_xent_rows_kernel<<<blocks, kThreads, 0, stream_of(logits)>>>(
        ptr<const float>(logits), ptr<const int64_t>(labels), rows, cols, ptr<float>(probs),
        ptr<float>(row_loss));
    cuda_api::check_last_error("softmax_xent_rows_kernel");
  }
  reduce_sum(loss, ptr<const float>(row_loss), rows, inv_rows, ptr<float>(loss));
}

void softmax_xent_backward(const Tensor& probs, const Tensor& labels, const Tensor& grad_loss,
                           Tensor& grad_logits) {
  const int64_t rows = probs.size(0), cols = probs.size(1);
  if (cols == 0) return;
  const SoftmaxXentBackwardFn fn{
      ptr<const float>(probs), ptr<const int64_t>(labels), ptr<const float>(grad_loss), rows, cols,
      ptr<float>(grad_logits)};
  detail::for_each_index(grad_logits, grad_logits.numel(), fn, "softmax_xent_backward");
}

}  // namespace ddp::kernels::cuda
