// The kernels of runtime/ops/cuda run on the CPU (Note [emulated CUDA device]).
//
// cmake/emulate_cuda.py turns each .cu file into C++ that includes this header first
// and launches through cuda_emu::launch instead of `<<<...>>>`; the kernels' source is
// otherwise the one nvcc compiles. This header gives that C++ what nvcc would: the
// built-in indices (threadIdx, blockIdx, blockDim, gridDim), __syncthreads, the warp
// shuffle, __shared__ (one copy per block) and the rounded arithmetic intrinsics.
//
// Note [emulated CUDA device]: a build configured with -DDDP_CUDA=EMULATE has a CUDA
// device whose memory is host memory and whose kernels run on the CPU, one fiber per
// CUDA thread, a block at a time: the device ops, their dispatch and the gpu tests run
// on a machine without a GPU, under AddressSanitizer in CI, so that a kernel's
// indexing, tails and block synchronization are checked before a GPU is lent.
// Enabled at run time by DDP_CUDA_EMULATION=N (N emulated devices); without it the
// build has no CUDA device. What it cannot check: timing, stream overlap (every
// stream runs in order at once), cuBLASLt's and cuDNN's fused paths (absent, so the
// ops take their fallbacks), CUDA graphs and NCCL (absent), and anything that
// depends on the GPU's memory model beyond __syncthreads.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

namespace ddp::cuda_emu {

// The <<<grid, block, shared_bytes, stream>>> of a launch.
struct Config {
  Config(dim3 grid_, dim3 block_, size_t shared_ = 0, cudaStream_t stream_ = nullptr)
      : grid(grid_), block(block_), shared(shared_), stream(stream_) {}
  dim3 grid, block;
  size_t shared;
  cudaStream_t stream;
};

// Runs body(ctx) as every thread of every block of `config`'s grid, on the calling
// thread; one launch at a time in the process. A bad configuration or a block whose
// threads do not all reach the same __syncthreads is recorded as the thread's last
// launch error (take_last_error), as CUDA records a failed launch.
void run_grid(const char* name, const Config& config, void (*body)(void*), void* ctx);

// The error of this thread's last failed launch since the last call, "" if none.
const char* take_last_error();

// Why a launch into `stream` is wrong ("" if it is not): cuda_api_emu.cpp's check that
// the stream belongs to the current device, as CUDA requires.
std::string stream_problem(cudaStream_t stream);

template <typename Body, typename... Args>
void launch(const char* name, const Config& config, Body body, Args... args) {
  auto call = [&] { body(args...); };
  run_grid(
      name, config, [](void* c) { (*static_cast<decltype(call)*>(c))(); }, &call);
}

// The running thread's indices (valid inside run_grid's body).
const uint3& thread_idx();
const uint3& block_idx();
const dim3& block_dim();
const dim3& grid_dim();

void sync_threads();
// Every lane of the warp stores `bytes` and gets lane `src`'s (same call of each).
void warp_exchange(const void* value, void* out, size_t bytes, int src_lane_xor, int width);

}  // namespace ddp::cuda_emu

#define threadIdx (::ddp::cuda_emu::thread_idx())
#define blockIdx (::ddp::cuda_emu::block_idx())
#define blockDim (::ddp::cuda_emu::block_dim())
#define gridDim (::ddp::cuda_emu::grid_dim())

// A __shared__ array is one per block; blocks run one after another and launches
// one at a time, so a static is exactly that.
#undef __shared__
#define __shared__ static

inline void __syncthreads() {
  ::ddp::cuda_emu::sync_threads();
}

template <typename T>
T __shfl_xor_sync(unsigned /*mask*/, T value, int lane_mask, int width = 32) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 16);
  T out;
  ::ddp::cuda_emu::warp_exchange(&value, &out, sizeof(T), lane_mask, width);
  return out;
}

// CUDA's math library has these at global scope for float and double.
using std::isfinite;
using std::isinf;
using std::isnan;

// Bit casts (math_constants.h's CUDART_INF_F and friends use them).
inline float __int_as_float(int v) {
  float f;
  std::memcpy(&f, &v, sizeof f);
  return f;
}
inline double __longlong_as_double(long long v) {
  double d;
  std::memcpy(&d, &v, sizeof d);
  return d;
}

// Rounded single operations: the CPU build compiles with -ffp-contract=off, so a
// plain operation is already one rounding, as these are on the GPU.
inline float __fadd_rn(float a, float b) {
  return a + b;
}
inline float __fsub_rn(float a, float b) {
  return a - b;
}
inline float __fmul_rn(float a, float b) {
  return a * b;
}
inline double __dadd_rn(double a, double b) {
  return a + b;
}
inline double __dmul_rn(double a, double b) {
  return a * b;
}
