// Checks for CUDA runtime and cuBLAS calls, and a guard for the current device.
// Internal to runtime/cuda and runtime/ops/cuda: it includes CUDA's headers.
//
//   DDP_CUDA_CHECK(cudaMalloc(&p, bytes));     throws ddp::CudaError on failure
//   DDP_CUBLAS_CHECK(cublas().sgemm(...));     same; needs runtime/cuda/cublas_library.h
#pragma once

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

namespace ddp::cuda_api {

// Makes `device` current for the scope and restores the previous device, so that
// ddp never changes the caller's current device behind its back.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) : device_(device) {
    DDP_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device_) DDP_CUDA_CHECK(cudaSetDevice(device_));
  }
  ~DeviceGuard() {
    // A destructor must not throw; restoring a device that was valid a moment ago
    // does not fail in practice, and a failure would show in the next check.
    if (previous_ != device_) (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int device_;
  int previous_ = 0;
};

}  // namespace ddp::cuda_api
