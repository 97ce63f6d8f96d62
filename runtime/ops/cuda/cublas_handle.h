// The cuBLAS handle of the calling thread for a tensor's device, bound to that
// device's current stream (internal to ops/cuda; defined in gemm.cu).
#pragma once

#include "runtime/cuda/cublas_library.h"
#include "runtime/tensor.h"

#include <cstdint>

namespace ddp::kernels::cuda::detail {

// Handles are not thread-safe to share while setting streams, and belong to the
// device current at creation: one per (thread, device), made on first use.
cublasHandle_t cublas_handle_for(const Tensor& t);

// v as the int cuBLAS takes; throws ValueError naming `op` and `what` when it does not fit.
int cublas_int(int64_t v, const char* op, const char* what);

}  // namespace ddp::kernels::cuda::detail
