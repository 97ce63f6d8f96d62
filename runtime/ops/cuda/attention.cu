// Batched matmul and the packed causal self-attention on CUDA: cuBLAS strided
// batched sgemm (row-major by Note [row-major gemm] in gemm.cu) plus the causal
// softmax and softmax backward kernels of transformer.cu.
//
// Note [attention on cuda]: per batch element b, one strided batched sgemm runs all
// heads of one product: head h's q, k, v are the [T, D] matrices at columns h*D of
// each third of qkv[b] (leading dimension 3C, the heads D floats apart), and its
// output goes to y[b]'s columns h*D (leading dimension C). So no head is copied
// (Note [packed attention] in ops/transformer_ops.h). Forward: probs[b] = q k^T /
// sqrt(D) straight into probs, then the causal softmax of all of probs in place,
// then y[b] = probs[b] v. Backward, with dS = softmax backward of dP through probs:
//   dP = dY v^T, dV = P^T dY, dQ = dS k / sqrt(D), dK = dS^T q / sqrt(D),
// every element of grad_qkv written once (beta = 0). dP / dS live in one [H, T, T]
// scratch from the caching allocator, reused for every b (the stream orders it).
// cuBLAS's sgemm is deterministic for a given GPU and shape; the softmax kernels
// are too (Note [row reduce] in row_reduce.cuh).
#include "runtime/ops/cuda/launch.cuh"  // first (see its top)

#include "runtime/cuda/cublas_library.h"
#include "runtime/ops/cuda/cublas_handle.h"
#include "runtime/ops/kernels.h"

#include <climits>
#include <cmath>

namespace ddp::kernels::cuda {
namespace {

using detail::cublas_int;
using detail::ptr;

// Matrix i of a strided batch starts at p + i * stride, a row-major matrix whose
// rows are `ld` floats apart; `trans` multiplies by its transpose.
struct Operand {
  const float* p;
  int64_t ld, stride;
  bool trans = false;
};
struct Output {
  float* p;
  int64_t ld, stride;
};
struct GemmShape {
  int64_t m, n, k, batch;
};

// out[i] = alpha op(a[i]) op(b[i]) for i < batch, op(a[i]) [m, k] and op(b[i]) [k, n],
// row-major: column-major out^T = op(b)^T op(a)^T (Note [row-major gemm] in gemm.cu).
void strided_gemm(const Tensor& on, const char* op, const Operand& a, const Operand& b,
                  const Output& out, const GemmShape& s, float alpha) {
  const float beta = 0.0f;  // cuBLAS does not read out when beta is 0
  DDP_CUBLAS_CHECK(cuda_api::cublas().sgemm_strided_batched(
      detail::cublas_handle_for(on), b.trans ? CUBLAS_OP_T : CUBLAS_OP_N,
      a.trans ? CUBLAS_OP_T : CUBLAS_OP_N, cublas_int(s.n, op, "n"), cublas_int(s.m, op, "m"),
      cublas_int(s.k, op, "k"), &alpha, b.p, cublas_int(std::max<int64_t>(b.ld, 1), op, "ldb"),
      b.stride, a.p, cublas_int(std::max<int64_t>(a.ld, 1), op, "lda"), a.stride, &beta, out.p,
      cublas_int(std::max<int64_t>(out.ld, 1), op, "ldc"), out.stride,
      cublas_int(s.batch, op, "batch")));
}

// The geometry of Note [packed attention] for qkv [B, T, 3C] and `heads` heads.
struct Packed {
  int64_t batch, t, c, heads, d;
  float scale;  // 1 / sqrt(D), as functional::causal_attention computes it
  Packed(const Tensor& qkv, int64_t h)
      : batch(qkv.size(0)),
        t(qkv.size(1)),
        c(qkv.size(2) / 3),
        heads(h),
        d(c / h),
        scale(1.0f / std::sqrt(static_cast<float>(d))) {}
  // Head 0 of q (part 0), k (1) or v (2) of batch element b in `base` ([B, T, 3C]).
  Operand head(const float* base, int64_t b, int part, bool trans = false) const {
    return {base + b * t * 3 * c + part * c, 3 * c, d, trans};
  }
  Output head_out(float* base, int64_t b, int part) const {
    return {base + b * t * 3 * c + part * c, 3 * c, d};
  }
  // Head 0 of y or grad_y ([B, T, C]) of batch element b.
  int64_t y_offset(int64_t b) const { return b * t * c; }
  // [T, T] matrices per head: batch element b's scores start at b * heads * t * t.
  int64_t probs_offset(int64_t b) const { return b * heads * t * t; }
  GemmShape scores() const { return {t, t, d, heads}; }  // [T, D] x [D, T]
  GemmShape values() const { return {t, d, t, heads}; }  // [T, T] x [T, D]
};

}  // namespace

void bmm(const Tensor& a, const Tensor& b, Tensor& out, bool trans_a, bool trans_b, float alpha) {
  const int64_t batch = out.size(0), m = out.size(1), n = out.size(2);
  const int64_t k = trans_a ? a.size(1) : a.size(2);
  cuda_api::DeviceGuard guard(out.device().index);
  strided_gemm(out, "bmm", {ptr<const float>(a), a.size(2), a.size(1) * a.size(2), trans_a},
               {ptr<const float>(b), b.size(2), b.size(1) * b.size(2), trans_b},
               {ptr<float>(out), n, m * n}, {m, n, k, batch}, alpha);
}

void attention_forward(const Tensor& qkv, int64_t heads, Tensor& y, Tensor& probs) {
  const Packed g(qkv, heads);
  const auto* x = ptr<const float>(qkv);
  auto* p = ptr<float>(probs);
  cuda_api::DeviceGuard guard(y.device().index);
  const char* op = "causal_self_attention";
  for (int64_t b = 0; b < g.batch; ++b) {
    const Output scores{p + g.probs_offset(b), g.t, g.t * g.t};
    strided_gemm(y, op, g.head(x, b, 0), g.head(x, b, 1, /*trans=*/true), scores, g.scores(),
                 g.scale);
  }
  causal_softmax(probs, probs);  // in place (transformer.cu's row kernels allow it)
  for (int64_t b = 0; b < g.batch; ++b) {
    const Operand weights{p + g.probs_offset(b), g.t, g.t * g.t};
    const Output out{ptr<float>(y) + g.y_offset(b), g.c, g.d};
    strided_gemm(y, op, weights, g.head(x, b, 2), out, g.values(), 1.0f);
  }
}

void attention_backward(const Tensor& grad_y, const Tensor& qkv, const Tensor& probs, int64_t heads,
                        Tensor& grad_qkv) {
  const Packed g(qkv, heads);
  const auto* x = ptr<const float>(qkv);
  const auto* p = ptr<const float>(probs);
  auto* gx = ptr<float>(grad_qkv);
  cuda_api::DeviceGuard guard(grad_qkv.device().index);
  const char* op = "causal_self_attention_backward";
  // dP, then dS in place: one [1, H, T, T] for every b (Note [attention on cuda]).
  Tensor ds = empty({1, g.heads, g.t, g.t}, {.device = grad_qkv.device()});
  const Output ds_out{ptr<float>(ds), g.t, g.t * g.t};
  const Operand ds_in{ptr<const float>(ds), g.t, g.t * g.t};
  const Operand ds_in_t{ptr<const float>(ds), g.t, g.t * g.t, true};
  for (int64_t b = 0; b < g.batch; ++b) {
    const Operand dy{ptr<const float>(grad_y) + g.y_offset(b), g.c, g.d};
    const Operand probs_t{p + g.probs_offset(b), g.t, g.t * g.t, true};
    strided_gemm(grad_qkv, op, dy, g.head(x, b, 2, /*trans=*/true), ds_out, g.scores(), 1.0f);
    strided_gemm(grad_qkv, op, probs_t, dy, g.head_out(gx, b, 2), g.values(), 1.0f);
    const Tensor probs_b = probs.slice(b, b + 1);
    softmax_backward(ds, probs_b, /*log=*/false, ds);  // in place
    strided_gemm(grad_qkv, op, ds_in, g.head(x, b, 1), g.head_out(gx, b, 0), g.values(), g.scale);
    strided_gemm(grad_qkv, op, ds_in_t, g.head(x, b, 0), g.head_out(gx, b, 1), g.values(), g.scale);
  }
}

}  // namespace ddp::kernels::cuda
