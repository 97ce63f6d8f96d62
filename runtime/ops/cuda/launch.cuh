// Launch helpers shared by the CUDA kernels in ops/cuda (internal; .cu files only).
//
//   for_each_index(t, n, fn, "relu")   runs fn(i) for i in [0, n) on t's device and
//                                      current stream, then checks the launch.
//   map_elements("gelu", t, n, f, out, x)   out[i] = f(x[i]) for i in [0, n), each
//                                      array in 16-byte vectors (Note [vectorized
//                                      elementwise] in vec_map.h): for contiguous
//                                      arrays and a function of the values alone.
#pragma once

// Include this header first in every .cu file. fmt 9 turns constexpr off when it
// sees __NVCC__, which in C++20 breaks both nvcc's front end (consteval format
// strings) and the host compiler (constexpr functions calling non-constexpr ones).
// Turning it back on makes the .cu files see fmt exactly as the .cpp files do.
#if defined(__NVCC__) && !defined(FMT_USE_CONSTEXPR)
#define FMT_USE_CONSTEXPR 1
#endif

#include "runtime/cuda/cuda_api.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/ops/cuda/vec_map.h"
#include "runtime/stream.h"
#include "runtime/tensor.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace ddp::kernels::cuda::detail {

constexpr int kThreads = 256;
// Grid-stride loops cover any n; a fixed cap (not one derived from the SM count)
// keeps the partition, and so every reduction order, the same on every GPU.
constexpr int64_t kMaxBlocks = 4096;

inline int blocks_for(int64_t n) {
  return static_cast<int>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, kMaxBlocks));
}

inline cudaStream_t stream_of(const Tensor& t) {
  return static_cast<cudaStream_t>(current_stream(t.device()).handle());
}

template <typename T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}

__device__ __forceinline__ int64_t global_thread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_threads() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

template <typename Fn>
__global__ void for_each_index_kernel(int64_t n, Fn fn) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) fn(i);
}

// Fn is a struct with `__device__ void operator()(int64_t i) const` (the build does
// not enable extended lambdas).
template <typename Fn>
void for_each_index(const Tensor& on, int64_t n, const Fn& fn, const char* name) {
  if (n == 0) return;
  cuda_api::DeviceGuard guard(on.device().index);
  for_each_index_kernel<<<blocks_for(n), kThreads, 0, stream_of(on)>>>(n, fn);
  cuda_api::check_last_error(name);
}

template <int V, typename F, typename Out, typename... In>
__global__ void map_kernel(int64_t n, bool whole, F f, Out* out, const In*... in) {
  vec::map_thread<V>(global_thread(), grid_threads(), n, whole, f, out, in...);
}

// out[i] = f(in[i]...) for i in [0, n): F is a struct with `__device__ Out
// operator()(In...) const` (values, not indices), every array contiguous with n
// elements (out may be one of the inputs: each element is read before it is
// written, by the same thread). Vectors of vec::widest_map<Out, In...>() elements,
// each one access where every address allows, else element by element.
template <typename F, typename Out, typename... In>
void map_elements(const char* name, const Tensor& on, int64_t n, const F& f, Out* out,
                  const In*... in) {
  if (n == 0) return;
  constexpr int kWidth = vec::widest_map<Out, In...>();
  const bool whole = vec::map_whole<kWidth>(out, in...);
  cuda_api::DeviceGuard guard(on.device().index);
  map_kernel<kWidth><<<blocks_for(vec::map_threads(n, kWidth)), kThreads, 0, stream_of(on)>>>(
      n, whole, f, out, in...);
  cuda_api::check_last_error(name);
}

}  // namespace ddp::kernels::cuda::detail
