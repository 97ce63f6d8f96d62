// The bare cuBLAS SGEMM that `bench gemm` puts next to ddp::matmul_out on a GPU.
//
// Compiled from gemm_cublas.cpp in a CUDA build and from gemm_cublas_stub.cpp
// otherwise, where constructing a BareCublas throws DeviceError.
#pragma once

#include "runtime/device.h"

#include <cstdint>

namespace ddp::bench {

// Row-major out[m, n] = op(a)[m, k] * op(b)[k, n], alpha 1, beta 0: the
// semantics of ddp::matmul_out with MatmulOptions{trans_a, trans_b}.
struct GemmDims {
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  bool trans_a = false;  // a is stored [k, m]
  bool trans_b = false;  // b is stored [n, k]
};

// A cuBLAS handle on `device`, bound to the device's current stream at construction.
// Calls do not synchronize. Failures throw ddp::CudaError naming the call.
class BareCublas {
 public:
  explicit BareCublas(const Device& device);
  ~BareCublas();
  BareCublas(const BareCublas&) = delete;
  BareCublas& operator=(const BareCublas&) = delete;

  // a, b and out are device pointers to f32 data of the shapes `dims` implies.
  void sgemm(const GemmDims& dims, const float* a, const float* b, float* out);

 private:
  void* handle_ = nullptr;  // cublasHandle_t
};

}  // namespace ddp::bench
