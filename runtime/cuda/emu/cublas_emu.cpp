// cublas_library.h for the emulated CUDA device (Note [emulated CUDA device] in
// kernel_emu.h): the handful of cuBLAS calls ddp makes, as plain loops over host
// memory with cuBLAS's column-major contract, summed in fp32 (CUBLAS_COMPUTE_32F) by
// OpenBLAS; beta == 0 does not read C, as in cuBLAS.
#include "runtime/cuda/cublas_library.h"

#include <cblas.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace ddp::cuda_api {
namespace {

struct Handle {
  cudaStream_t stream = nullptr;
};

float load(const void* p, cudaDataType type, int64_t i) {
  switch (type) {
    case CUDA_R_32F:
      return static_cast<const float*>(p)[i];
    case CUDA_R_16BF:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case CUDA_R_16F:
      return __half2float(static_cast<const __half*>(p)[i]);
    default:
      return 0.0f;
  }
}

void store(void* p, cudaDataType type, int64_t i, float v) {
  switch (type) {
    case CUDA_R_32F:
      static_cast<float*>(p)[i] = v;
      break;
    case CUDA_R_16BF:
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
      break;
    case CUDA_R_16F:
      static_cast<__half*>(p)[i] = __float2half_rn(v);
      break;
    default:
      break;
  }
}

bool supported(cudaDataType t) {
  return t == CUDA_R_32F || t == CUDA_R_16BF || t == CUDA_R_16F;
}

// A column-major rows x cols X with leading dimension ld as fp32 with the same layout
// (bf16 and fp16 widen exactly). Only each column's rows are read: past them may be
// another tensor, or nothing (the last column of a view).
const float* as_f32(const void* x, cudaDataType type, int64_t rows, int64_t ld, int64_t cols,
                    std::vector<float>& widened) {
  if (type == CUDA_R_32F) return static_cast<const float*>(x);
  widened.assign(static_cast<size_t>(ld * cols), 0.0f);
  for (int64_t c = 0; c < cols; ++c)
    for (int64_t r = 0; r < rows; ++r)
      widened[static_cast<size_t>(r + c * ld)] = load(x, type, r + c * ld);
  return widened.data();
}

cublasStatus_t gemm(cublasHandle_t handle, cublasOperation_t op_a, cublasOperation_t op_b, int m,
                    int n, int k, float alpha, const void* a, cudaDataType ta, int lda,
                    const void* b, cudaDataType tb, int ldb, float beta, void* c, cudaDataType tc,
                    int ldc) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (m < 0 || n < 0 || k < 0 || ldc < std::max(1, m)) return CUBLAS_STATUS_INVALID_VALUE;
  if (lda < std::max(1, op_a == CUBLAS_OP_N ? m : k) ||
      ldb < std::max(1, op_b == CUBLAS_OP_N ? k : n))
    return CUBLAS_STATUS_INVALID_VALUE;
  // cublasGemmEx's table for CUBLAS_COMPUTE_32F: A and B of one type, C of that type
  // or fp32 (fp32 inputs: fp32 C).
  if (!supported(ta) || ta != tb || (tc != ta && tc != CUDA_R_32F))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  // fp32 sums through OpenBLAS (an order cuBLAS may use too); other types widen first
  // and round once at the end, as CUBLAS_COMPUTE_32F does.
  std::vector<float> wa, wb, wc;
  const bool na = op_a == CUBLAS_OP_N, nb = op_b == CUBLAS_OP_N;
  const float* fa = as_f32(a, ta, na ? m : k, lda, na ? k : m, wa);
  const float* fb = as_f32(b, tb, nb ? k : n, ldb, nb ? n : k, wb);
  float* fc = static_cast<float*>(c);
  if (tc != CUDA_R_32F) {
    wc.assign(static_cast<size_t>(ldc) * static_cast<size_t>(n), 0.0f);
    if (beta != 0.0f)
      for (int64_t j = 0; j < n; ++j)
        for (int64_t i = 0; i < m; ++i)
          wc[static_cast<size_t>(i + j * ldc)] = load(c, tc, i + j * ldc);
    fc = wc.data();
  } else if (beta == 0.0f) {
    for (int64_t j = 0; j < n; ++j) std::fill_n(fc + j * ldc, m, 0.0f);  // never read C
  }
  if (k == 0) {
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < m; ++i) fc[i + j * ldc] *= beta;
  } else {
    cblas_sgemm(CblasColMajor, op_a == CUBLAS_OP_N ? CblasNoTrans : CblasTrans,
                op_b == CUBLAS_OP_N ? CblasNoTrans : CblasTrans, m, n, k, alpha, fa, lda, fb, ldb,
                beta, fc, ldc);
  }
  if (tc != CUDA_R_32F)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < m; ++i) store(c, tc, i + j * ldc, fc[i + j * ldc]);
  return CUBLAS_STATUS_SUCCESS;
}

size_t element_bytes(cudaDataType t) {
  return t == CUDA_R_32F ? 4 : 2;
}

const void* offset(const void* p, cudaDataType t, long long elements) {
  return static_cast<const char*>(p) + elements * static_cast<long long>(element_bytes(t));
}

cublasStatus_t create(cublasHandle_t* handle) {
  *handle = reinterpret_cast<cublasHandle_t>(new Handle);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t destroy(cublasHandle_t handle) {
  delete reinterpret_cast<Handle*>(handle);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t set_stream(cublasHandle_t handle, cudaStream_t stream) {
  reinterpret_cast<Handle*>(handle)->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t set_workspace(cublasHandle_t, void*, size_t) {
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t sgemm(cublasHandle_t h, cublasOperation_t op_a, cublasOperation_t op_b, int m, int n,
                     int k, const float* alpha, const float* a, int lda, const float* b, int ldb,
                     const float* beta, float* c, int ldc) {
  return gemm(h, op_a, op_b, m, n, k, *alpha, a, CUDA_R_32F, lda, b, CUDA_R_32F, ldb, *beta, c,
              CUDA_R_32F, ldc);
}

cublasStatus_t sgemm_strided_batched(cublasHandle_t h, cublasOperation_t op_a,
                                     cublasOperation_t op_b, int m, int n, int k,
                                     const float* alpha, const float* a, int lda,
                                     long long stride_a, const float* b, int ldb,
                                     long long stride_b, const float* beta, float* c, int ldc,
                                     long long stride_c, int batches) {
  if (batches < 0) return CUBLAS_STATUS_INVALID_VALUE;
  for (int i = 0; i < batches; ++i) {
    const cublasStatus_t s =
        gemm(h, op_a, op_b, m, n, k, *alpha, a + i * stride_a, CUDA_R_32F, lda, b + i * stride_b,
             CUDA_R_32F, ldb, *beta, c + i * stride_c, CUDA_R_32F, ldc);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
  }
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t gemm_ex(cublasHandle_t h, cublasOperation_t op_a, cublasOperation_t op_b, int m,
                       int n, int k, const void* alpha, const void* a, cudaDataType ta, int lda,
                       const void* b, cudaDataType tb, int ldb, const void* beta, void* c,
                       cudaDataType tc, int ldc, cublasComputeType_t compute, cublasGemmAlgo_t) {
  if (compute != CUBLAS_COMPUTE_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  return gemm(h, op_a, op_b, m, n, k, *static_cast<const float*>(alpha), a, ta, lda, b, tb, ldb,
              *static_cast<const float*>(beta), c, tc, ldc);
}

cublasStatus_t gemm_strided_batched_ex(cublasHandle_t h, cublasOperation_t op_a,
                                       cublasOperation_t op_b, int m, int n, int k,
                                       const void* alpha, const void* a, cudaDataType ta, int lda,
                                       long long stride_a, const void* b, cudaDataType tb, int ldb,
                                       long long stride_b, const void* beta, void* c,
                                       cudaDataType tc, int ldc, long long stride_c, int batches,
                                       cublasComputeType_t compute, cublasGemmAlgo_t) {
  if (compute != CUBLAS_COMPUTE_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (batches < 0) return CUBLAS_STATUS_INVALID_VALUE;
  for (int i = 0; i < batches; ++i) {
    const cublasStatus_t s =
        gemm(h, op_a, op_b, m, n, k, *static_cast<const float*>(alpha), offset(a, ta, i * stride_a),
             ta, lda, offset(b, tb, i * stride_b), tb, ldb, *static_cast<const float*>(beta),
             const_cast<void*>(offset(c, tc, i * stride_c)), tc, ldc);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
  }
  return CUBLAS_STATUS_SUCCESS;
}

const char* status_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    default:
      return "CUBLAS_STATUS_UNKNOWN";
  }
}
const char* status_string(cublasStatus_t s) {
  return status_name(s);
}

}  // namespace

const CublasLibrary& cublas() {
  static const CublasLibrary api{
      .create = create,
      .destroy = destroy,
      .set_stream = set_stream,
      .set_workspace = set_workspace,
      .sgemm = sgemm,
      .sgemm_strided_batched = sgemm_strided_batched,
      .gemm_ex = gemm_ex,
      .gemm_strided_batched_ex = gemm_strided_batched_ex,
      .status_name = status_name,
      .status_string = status_string,
  };
  return api;
}

}  // namespace ddp::cuda_api
