// Batched matmul and the packed causal self-attention on CUDA: the plans of
// attention_plan.h (Note [attention on cuda]) run with cuBLAS's strided batched sgemm
// and transformer.cu's causal softmax and softmax backward kernels. cuBLAS's sgemm is
// deterministic for a given GPU and shape, and so are the softmax kernels (Note [row
// reduce] in row_reduce.cuh).
#include "runtime/ops/cuda/launch.cuh"  // first (see its top)

#include "runtime/cuda/cublas_library.h"
#include "runtime/ops/cuda/attention_plan.h"
#include "runtime/ops/cuda/cublas_handle.h"
#include "runtime/ops/cuda/float_types.cuh"
#include "runtime/ops/cuda/row_kernels.h"
#include "runtime/ops/cuda/row_reduce.cuh"
#include "runtime/ops/kernels.h"

#include <type_traits>

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

// ---- Note [16-bit attention on cuda] (attention_plan.h) ----------------------------

template <typename T>
cudaDataType_t cuda_type() {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return CUDA_R_16BF;
  } else if constexpr (std::is_same_v<T, __half>) {
    return CUDA_R_16F;
  } else {
    static_assert(std::is_same_v<T, float>, "float, __nv_bfloat16 or __half");
    return CUDA_R_32F;
  }
}

// Row r of x (f32 scores) is row i = r % t of its [t, t] matrix: the softmax of
// columns 0..i into out (type Out), exact zeros after; one block per row, the sum in
// double as the f32 causal softmax.
template <typename Out>
__global__ void causal_softmax_to_kernel(const float* x, int64_t rows, int64_t t, Out* out) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t seen = r % t + 1;
    const float* src = x + r * t;
    Out* dst = out + r * t;
    float max = -INFINITY;
    for (int64_t j = threadIdx.x; j < seen; j += blockDim.x) max = fmaxf(max, src[j]);
    max = detail::block_all_max(max);
    double sum = 0.0;
    for (int64_t j = threadIdx.x; j < seen; j += blockDim.x) {
      sum += exp(static_cast<double>(src[j] - max));
    }
    const auto inv = static_cast<float>(1.0 / detail::block_all_sum(sum));
    for (int64_t j = threadIdx.x; j < t; j += blockDim.x) {
      dst[j] = detail::from_float<Out>(j < seen ? expf(src[j] - max) * inv : 0.0f);
    }
  }
}

// out = y (grad - sum(grad y)) per row of d: grad f32 (dP), y and out of type T.
template <typename T>
__global__ void softmax_backward_to_kernel(const float* grad, const T* y, int64_t rows, int64_t d,
                                           T* out) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* g = grad + r * d;
    const T* p = y + r * d;
    double acc = 0.0;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      acc += static_cast<double>(g[j]) * detail::to_float(p[j]);
    }
    const auto s = static_cast<float>(detail::block_all_sum(acc));
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      out[r * d + j] = detail::from_float<T>(detail::to_float(p[j]) * (g[j] - s));
    }
  }
}

// The Ops of forward16 / backward16 on `on`'s device and current stream.
struct CudaOps16 {
  const Tensor& on;
  const char* op;

  template <typename A, typename B, typename C>
  void gemm(const plan::OperandOf<A>& a, const plan::OperandOf<B>& b, const plan::OutputOf<C>& out,
            const plan::GemmShape& s, float alpha) const {
    const auto g = plan::column_major(a, b, out, s);  // its a is our b (Note [row-major gemm])
    const float beta = 0.0f;
    DDP_CUBLAS_CHECK(cuda_api::cublas().gemm_strided_batched_ex(
        detail::cublas_handle_for(on), g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
        g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, cublas_int(g.m, op, "m"), cublas_int(g.n, op, "n"),
        cublas_int(g.k, op, "k"), &alpha, g.a, cuda_type<B>(), cublas_int(g.lda, op, "lda"),
        g.stride_a, g.b, cuda_type<A>(), cublas_int(g.ldb, op, "ldb"), g.stride_b, &beta, g.c,
        cuda_type<C>(), cublas_int(g.ldc, op, "ldc"), g.stride_c, cublas_int(g.batch, op, "batch"),
        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  template <typename T>
  void causal_softmax(const float* scores, int64_t rows, int64_t t, T* probs) const {
    causal_softmax_to_kernel<T>
        <<<detail::row_blocks(rows), detail::kThreads, 0, detail::stream_of(on)>>>(scores, rows, t,
                                                                                   probs);
    cuda_api::check_last_error("causal_softmax_to_kernel");
  }
  template <typename T>
  void softmax_backward(const float* dp, const T* p, int64_t rows, int64_t t, T* ds) const {
    softmax_backward_to_kernel<T>
        <<<detail::row_blocks(rows), detail::kThreads, 0, detail::stream_of(on)>>>(dp, p, rows, t,
                                                                                   ds);
    cuda_api::check_last_error("softmax_backward_to_kernel");
  }
};

// Calls fn(Tag<T>{}) for 16-bit dtypes.
template <typename Fn>
void dispatch_16bit(DType dtype, Fn&& fn) {
  if (dtype == DType::bf16) return fn(detail::Tag<__nv_bfloat16>{});
  DDP_ASSERT(dtype == DType::f16, "16-bit attention reached with dtype {}", dtype_name(dtype));
  fn(detail::Tag<__half>{});
}

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
  if (qkv.dtype() != DType::f32) {  // Note [16-bit attention on cuda]
    const Tensor scores = empty({g.heads * g.t * g.t}, {.device = y.device()});
    const CudaOps16 ops{y, "causal_self_attention"};
    dispatch_16bit(qkv.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      plan::forward16(g, ptr<const T>(qkv), ptr<T>(y), ptr<T>(probs), ptr<float>(scores), ops);
    });
    return;
  }
  const CudaOps ops{y, "causal_self_attention"};
  plan::forward(g, ptr<const float>(qkv), ptr<float>(y), ptr<float>(probs), ops);
}

void attention_backward(const Tensor& grad_y, const Tensor& qkv, const Tensor& probs, int64_t heads,
                        Tensor& grad_qkv) {
  const plan::Packed g(qkv.size(0), qkv.size(1), qkv.size(2), heads);
  cuda_api::DeviceGuard guard(grad_qkv.device().index);
  if (qkv.dtype() != DType::f32) {  // Note [16-bit attention on cuda]
    const Tensor dp = empty({g.heads * g.t * g.t}, {.device = grad_qkv.device()});
    const Tensor ds =
        empty({g.heads * g.t * g.t}, {.dtype = qkv.dtype(), .device = grad_qkv.device()});
    const CudaOps16 ops{grad_qkv, "causal_self_attention_backward"};
    dispatch_16bit(qkv.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      plan::backward16(g, ptr<const T>(grad_y), ptr<const T>(qkv), ptr<const T>(probs),
                       ptr<float>(dp), ptr<T>(ds), ptr<T>(grad_qkv), ops);
    });
    return;
  }
  // From the caching allocator on this stream (see reduce_sum in reduce.cu on freeing
  // it while the kernels still run).
  const Tensor ds = empty({g.heads * g.t * g.t}, {.device = grad_qkv.device()});
  const CudaOps ops{grad_qkv, "causal_self_attention_backward"};
  plan::backward(g, ptr<const float>(grad_y), ptr<const float>(qkv), ptr<const float>(probs),
                 ptr<float>(ds), ptr<float>(grad_qkv), ops);
}

}  // namespace ddp::kernels::cuda
