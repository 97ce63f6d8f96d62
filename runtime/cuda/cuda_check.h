// Checks for CUDA runtime and cuBLAS calls (the device guard is in cuda_api.h).
// Internal to runtime/cuda and runtime/ops/cuda: it includes CUDA's headers.
//
//   DDP_CUDA_CHECK(cudaMalloc(&p, bytes));     throws ddp::CudaError on failure
//   DDP_CUBLAS_CHECK(cublas().sgemm(...));     same; needs runtime/cuda/cublas_library.h
#pragma once

#include "runtime/cuda/cuda_api.h"
#include "runtime/error.h"

#include <cuda_runtime.h>

#include <string_view>

namespace ddp::cuda_api::detail {

// Clears CUDA's last-error slot too: a non-sticky failure reported here must not
// surface again in the next check_last_error() after an unrelated kernel launch.
[[noreturn]] inline void throw_cuda_error(cudaError_t err, std::string_view call) {
  (void)cudaGetLastError();
  throw CudaError(
      fmt::format("{} failed: {} ({})", call, cudaGetErrorString(err), cudaGetErrorName(err)));
}

inline void check_cuda(cudaError_t err, std::string_view call) {
  if (!DDP_LIKELY(err == cudaSuccess)) throw_cuda_error(err, call);
}

[[noreturn]] inline void throw_cublas_error(const char* status_name, int status,
                                            std::string_view call) {
  throw CudaError(fmt::format("{} failed: {} (cuBLAS status {})", call, status_name, status));
}

}  // namespace ddp::cuda_api::detail

#define DDP_CUDA_CHECK(call) ::ddp::cuda_api::detail::check_cuda((call), #call)

// A macro rather than a function so that only the files that use cuBLAS need its
// declarations (runtime/cuda/cublas_library.h, which opens it on first use).
#define DDP_CUBLAS_CHECK(call)                                                               \
  do {                                                                                       \
    const cublasStatus_t ddp_status_ = (call);                                               \
    if (!DDP_LIKELY(ddp_status_ == CUBLAS_STATUS_SUCCESS)) {                                 \
      ::ddp::cuda_api::detail::throw_cublas_error(                                           \
          ::ddp::cuda_api::cublas().status_name(ddp_status_), static_cast<int>(ddp_status_), \
          #call);                                                                            \
    }                                                                                        \
  } while (0)
