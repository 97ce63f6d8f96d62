// Block-wide reductions for the row kernels of ops/cuda (internal; .cu files only).
//
//   for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {   // one block per row
//     double s = 0.0; for (j = threadIdx.x; j < d; j += kThreads) s += x[r * d + j];
//     s = block_all_sum(s);                                      // every thread gets it
//   }
//
// Note [row reduce]: a row kernel runs one block of kThreads threads per row, a
// grid of min(rows, kMaxBlocks) blocks striding over the rows. Thread t takes
// columns t, t + kThreads, ... in order; the warps combine by a fixed xor butterfly
// and every thread then adds the kWarps warp results in warp order. The order of
// every addition depends only on the row length, so results are deterministic
// (run to run and GPU to GPU), and every thread of the block holds the same bits.
// (The row kernels that read in 16-byte vectors -- LayerNorm's, the classifier's --
// give thread t the elements Note [vectorized rows] in vec_map.h gives it instead;
// their order then also depends on where each row starts within a vector, which is
// fixed by the tensor's layout: still the same bits on every run.)
// Each call ends with a barrier, so a kernel may reduce several times, and a row
// may be overwritten in place after its last reduction.
#pragma once

#include "runtime/ops/cuda/launch.cuh"

#include <algorithm>

namespace ddp::kernels::cuda::detail {

constexpr int kWarp = 32;
constexpr int kWarps = kThreads / kWarp;
constexpr unsigned kFullMask = 0xffffffffu;
static_assert(kThreads % kWarp == 0, "row kernels need whole warps");

struct SumOp {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// The block's reduction of v under op (Note [row reduce]); all threads must call it.
template <typename T, typename Op>
__device__ T block_all_reduce(T v, Op op) {
  __shared__ T warp_results[kWarps];
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    v = op(v, __shfl_xor_sync(kFullMask, v, offset));
  }
  if (threadIdx.x % kWarp == 0) warp_results[threadIdx.x / kWarp] = v;
  __syncthreads();
  T result = warp_results[0];
  for (int w = 1; w < kWarps; ++w) result = op(result, warp_results[w]);
  __syncthreads();  // the next call overwrites warp_results
  return result;
}

__device__ __forceinline__ double block_all_sum(double v) {
  return block_all_reduce(v, SumOp{});
}
__device__ __forceinline__ float block_all_max(float v) {
  return block_all_reduce(v, MaxOp{});
}

// Blocks of a row kernel: one per row, at most kMaxBlocks (they stride).
inline int row_blocks(int64_t rows) {
  return static_cast<int>(std::clamp<int64_t>(rows, 1, kMaxBlocks));
}

}  // namespace ddp::kernels::cuda::detail
