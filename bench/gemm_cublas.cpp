// BareCublas in a CUDA build: plain cublasSgemm on the caller's buffers (through
// the cuBLAS that runtime/cuda/cublas_library.h opens on first use).
#include "bench/gemm_cublas.h"

#include "runtime/cuda/cublas_library.h"
#include "runtime/cuda/cuda_api.h"
#include "runtime/error.h"
#include "runtime/stream.h"

#include <cuda_runtime.h>

#include <limits>

#define DDP_BENCH_CUBLAS_CHECK(call)                                                    \
  do {                                                                                  \
    const cublasStatus_t status_ = (call);                                              \
    if (status_ != CUBLAS_STATUS_SUCCESS) {                                             \
      throw ::ddp::CudaError(::fmt::format("{} failed: {} ({})", #call,                 \
                                           cuda_api::cublas().status_name(status_),     \
                                           cuda_api::cublas().status_string(status_))); \
    }                                                                                   \
  } while (0)

namespace ddp::bench {
namespace {

cublasHandle_t as_handle(void* handle) {
  return static_cast<cublasHandle_t>(handle);
}

int checked_int(int64_t value, const char* what) {
  DDP_CHECK(value >= 0 && value <= std::numeric_limits<int>::max(),
            "cublasSgemm: {} = {} does not fit cuBLAS's int", what, value);
  return static_cast<int>(value);
}

}  // namespace

BareCublas::BareCublas(const Device& device) {
  DDP_CHECK_T(DeviceError, device.is_cuda(), "BareCublas needs a CUDA device, got {}",
              device.str());
  cuda_api::set_device(device.index);
  cublasHandle_t handle = nullptr;
  DDP_BENCH_CUBLAS_CHECK(cuda_api::cublas().create(&handle));
  handle_ = handle;
  const auto stream = static_cast<cudaStream_t>(current_stream(device).handle());
  try {
    DDP_BENCH_CUBLAS_CHECK(cuda_api::cublas().set_stream(handle, stream));
  } catch (...) {
    cuda_api::cublas().destroy(handle);
    throw;
  }
}

BareCublas::~BareCublas() {
  if (handle_ != nullptr) cuda_api::cublas().destroy(as_handle(handle_));
}

// Note [row-major through cuBLAS]: cuBLAS is column-major, and a row-major
// matrix read column-major is its transpose. So row-major C = op(A) op(B) is
// computed as column-major C^T = op(B)^T op(A)^T: B goes first, n and m swap,
// and each operand keeps its own transpose flag with its row-major row length
// as the leading dimension.
void BareCublas::sgemm(const GemmDims& dims, const float* a, const float* b, float* out) {
  const int m = checked_int(dims.m, "m");
  const int n = checked_int(dims.n, "n");
  const int k = checked_int(dims.k, "k");
  const int lda = dims.trans_a ? m : k;
  const int ldb = dims.trans_b ? k : n;
  const float alpha = 1.0f;
  const float beta = 0.0f;
  DDP_BENCH_CUBLAS_CHECK(cuda_api::cublas().sgemm(
      as_handle(handle_), dims.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
      dims.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b, ldb, a, lda, &beta, out, n));
}

}  // namespace ddp::bench
