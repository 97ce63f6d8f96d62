// CPU GEMM through OpenBLAS (CBLAS, row-major), or oneDNN's sgemm for the shapes
// where it is faster (Note [gemm choice] in onednn.cpp). bf16/f16 operands are
// widened to f32, multiplied, and rounded back: the CPU has no fast 16-bit GEMM here.
#include "runtime/ops/cpu/onednn.h"
#include "runtime/ops/kernels.h"
#include "runtime/ops/ops.h"

#include <cblas.h>

#include <climits>

namespace ddp::kernels::cpu {

namespace {

// Note [cpu bf16] applies to f32 tensors only: 16-bit ones keep their widened f32 product.
void gemm_f32(const Tensor& a, const Tensor& b, Tensor& out, bool trans_a, bool trans_b,
              float alpha, float beta, bool bf16_allowed) {
  const int64_t m = out.size(0), n = out.size(1);
  const int64_t k = trans_a ? a.size(0) : a.size(1);
  DDP_CHECK(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX,
            "matmul: dimensions m={} n={} k={} exceed the BLAS limit of {}", m, n, k, INT_MAX);
  if (m == 0 || n == 0) return;
  const int lda = static_cast<int>(a.size(1)), ldb = static_cast<int>(b.size(1));
  if (bf16_allowed && onednn::bf16() && k > 0) {  // Note [cpu bf16]
    onednn::matmul_bf16(trans_a, trans_b, m, n, k, alpha, a.data<float>(), lda, b.data<float>(),
                        ldb, beta, out.data<float>(), n);
    return;
  }
  if (onednn::sgemm_preferred(m, n, k)) {
    onednn::sgemm(trans_a, trans_b, m, n, k, alpha, a.data<float>(), lda, b.data<float>(), ldb,
                  beta, out.data<float>(), n);
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a.data<float>(), std::max(lda, 1), b.data<float>(),
              std::max(ldb, 1), beta, out.data<float>(), static_cast<int>(n));
}

}  // namespace

void gemm(const Tensor& a, const Tensor& b, Tensor& out, bool trans_a, bool trans_b, float alpha,
          float beta) {
  if (a.dtype() != DType::f32) {
    Tensor a32 = ddp::cast(a, DType::f32), b32 = ddp::cast(b, DType::f32);
    Tensor out32 = beta == 0.0f ? empty(out.shape()) : ddp::cast(out, DType::f32);
    gemm_f32(a32, b32, out32, trans_a, trans_b, alpha, beta, /*bf16_allowed=*/false);
    cast(out32, out);
    return;
  }
  gemm_f32(a, b, out, trans_a, trans_b, alpha, beta, /*bf16_allowed=*/true);
}

}  // namespace ddp::kernels::cpu
