// Batched matmul and the packed causal self-attention on CUDA: the plans of
// attention_plan.h (Note [attention on cuda]) run with cuBLAS's strided batched sgemm
// and transformer.cu's causal softmax and softmax backward kernels. cuBLAS's sgemm is
// deterministic for a given GPU and shape, and so are the softmax kernels (Note [row
// reduce] in row_reduce.cuh).
#include "runtime/ops/cuda/launch.cuh"  // first (see its top)

#include "runtime/cuda/cublas_library.h"
#include "runtime/ops/cuda/attention_plan.h"
#include "runtime/ops/cuda/cublas_handle.h"
#include "runtime/ops/cuda/row_kernels.h"
#include "runtime/ops/kernels.h"

namespace ddp::kernels::cuda {
namespace {

namespace plan = attention_plan;
using detail::cublas_int;
using detail::ptr;

// The Ops of attention_plan.h on `on`'s device and current stream; `op` names the
// public op in errors.
struct CudaOps {
  const Tensor& on;
  const char* op;

  void gemm(const plan::Operand& a, const plan::Operand& b, const plan::Output& out,
            const plan::GemmShape& s, float alpha) const {
    const plan::ColumnMajorGemm g = plan::column_major(a, b, out, s);
    const float beta = 0.0f;  // cuBLAS does not read c when beta is 0
    DDP_CUBLAS_CHECK(cuda_api::cublas().sgemm_strided_batched(
        detail::cublas_handle_for(on), g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
        g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, cublas_int(g.m, op, "m"), cublas_int(g.n, op, "n"),
        cublas_int(g.k, op, "k"), &alpha, g.a, cublas_int(g.lda, op, "lda"), g.stride_a, g.b,
        cublas_int(g.ldb, op, "ldb"), g.stride_b, &beta, g.c, cublas_int(g.ldc, op, "ldc"),
        g.stride_c, cublas_int(g.batch, op, "batch")));
  }
  void causal_softmax(float* x, int64_t rows, int64_t t) const {
    detail::launch_causal_softmax(on, x, rows, t, x);
  }
  void softmax_backward(float* grad, const float* y, int64_t rows, int64_t d) const {
    detail::launch_softmax_backward(on, grad, y, rows, d, /*log=*/false, grad);
  }
};

}  // namespace

void bmm(const Tensor& a, const Tensor& b, Tensor& out, bool trans_a, bool trans_b, float alpha) {
  const plan::Gemm g = plan::bmm_gemm(ptr<const float>(a), a.size(1), a.size(2), trans_a,
                                      ptr<const float>(b), b.size(1), b.size(2), trans_b,
                                      ptr<float>(out), out.size(0), out.size(1), out.size(2));
  cuda_api::DeviceGuard guard(out.device().index);
  const CudaOps ops{out, "bmm"};
  ops.gemm(g.a, g.b, g.out, g.shape, alpha);
}

void attention_forward(const Tensor& qkv, int64_t heads, Tensor& y, Tensor& probs) {
  const plan::Packed g(qkv.size(0), qkv.size(1), qkv.size(2), heads);
  cuda_api::DeviceGuard guard(y.device().index);
  const CudaOps ops{y, "causal_self_attention"};
  plan::forward(g, ptr<const float>(qkv), ptr<float>(y), ptr<float>(probs), ops);
}

void attention_backward(const Tensor& grad_y, const Tensor& qkv, const Tensor& probs, int64_t heads,
                        Tensor& grad_qkv) {
  const plan::Packed g(qkv.size(0), qkv.size(1), qkv.size(2), heads);
  cuda_api::DeviceGuard guard(grad_qkv.device().index);
  // From the caching allocator on this stream (see reduce_sum in reduce.cu on freeing
  // it while the kernels still run).
  const Tensor ds = empty({g.heads * g.t * g.t}, {.device = grad_qkv.device()});
  const CudaOps ops{grad_qkv, "causal_self_attention_backward"};
  plan::backward(g, ptr<const float>(grad_y), ptr<const float>(qkv), ptr<const float>(probs),
                 ptr<float>(ds), ptr<float>(grad_qkv), ops);
}

}  // namespace ddp::kernels::cuda
