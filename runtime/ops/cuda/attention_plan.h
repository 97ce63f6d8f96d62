// The host side of bmm and the packed attention on CUDA (attention.cu), as plain
// C++ so that a unit test can replay it on the CPU (tests/unit/attention_plan_test.cpp):
// the row-major to column-major mapping of every cuBLAS strided batched sgemm, the
// operands of each head inside qkv, and the order of the products and softmaxes.
// attention.cu runs the plans with cuBLAS and the softmax kernels; the test runs them
// with a column-major reference sgemm and the CPU softmaxes and compares with the CPU
// attention kernels.
//
// Note [attention on cuda]: per batch element b, one strided batched sgemm runs all
// heads of one product: head h's q, k, v are the [T, D] matrices at columns h*D of
// each third of qkv[b] (leading dimension 3C, the heads D floats apart), and its
// output goes to y[b]'s columns h*D (leading dimension C). So no head is copied
// (Note [packed attention] in ops/transformer_ops.h). Forward: probs[b] = q k^T /
// sqrt(D) straight into probs, then the causal softmax of all of probs in place,
// then y[b] = probs[b] v. Backward, with dS = the softmax backward of dP through probs:
//   dP = dY v^T, dV = P^T dY, dQ = dS k / sqrt(D), dK = dS^T q / sqrt(D),
// every element of grad_qkv written once (beta = 0). dP / dS live in one [H, T, T]
// scratch, reused for every b (the stream orders the uses).
#pragma once

#include <cmath>
#include <cstdint>

namespace ddp::kernels::attention_plan {

// Matrix i of a strided batch starts at p + i * stride, a row-major matrix whose rows
// are `ld` elements apart; `trans` multiplies by its transpose. T: the element type
// (float; the 16-bit attention's bf16 or f16 storage type too).
template <typename T>
struct OperandOf {
  const T* p;
  int64_t ld, stride;
  bool trans = false;
};
template <typename T>
struct OutputOf {
  T* p;
  int64_t ld, stride;
};
using Operand = OperandOf<float>;
using Output = OutputOf<float>;
// out[i] = op(a[i]) op(b[i]): op(a) [m, k], op(b) [k, n], i < batch.
struct GemmShape {
  int64_t m, n, k, batch;
};

// The arguments of cublasSgemmStridedBatched / cublasGemmStridedBatchedEx
// (column-major, BLAS semantics).
template <typename A, typename B, typename C>
struct ColumnMajorGemmOf {
  bool trans_a, trans_b;
  int64_t m, n, k;
  const A* a;
  int64_t lda, stride_a;
  const B* b;
  int64_t ldb, stride_b;
  C* c;
  int64_t ldc, stride_c;
  int64_t batch;
};
using ColumnMajorGemm = ColumnMajorGemmOf<float, float, float>;

// Note [row-major gemm] (gemm.cu): a row-major matrix read column-major is its
// transpose, so out = op(a) op(b) is computed as out^T = op(b)^T op(a)^T: swap the
// operands and m / n, keep the transpose flags and the row-major leading dimensions
// (at least 1, as cuBLAS requires even for empty matrices).
template <typename A, typename B, typename C>
ColumnMajorGemmOf<B, A, C> column_major(const OperandOf<A>& a, const OperandOf<B>& b,
                                        const OutputOf<C>& out, const GemmShape& s) {
  auto at_least_1 = [](int64_t v) { return v < 1 ? int64_t{1} : v; };
  return {.trans_a = b.trans,
          .trans_b = a.trans,
          .m = s.n,
          .n = s.m,
          .k = s.k,
          .a = b.p,
          .lda = at_least_1(b.ld),
          .stride_a = b.stride,
          .b = a.p,
          .ldb = at_least_1(a.ld),
          .stride_b = a.stride,
          .c = out.p,
          .ldc = at_least_1(out.ld),
          .stride_c = out.stride,
          .batch = s.batch};
}

// bmm: a [batch, a1, a2] and b [batch, b1, b2], contiguous, into out [batch, m, n].
struct Gemm {
  Operand a, b;
  Output out;
  GemmShape shape;
};
inline Gemm bmm_gemm(const float* a, int64_t a1, int64_t a2, bool trans_a, const float* b,
                     int64_t b1, int64_t b2, bool trans_b, float* out, int64_t batch, int64_t m,
                     int64_t n) {
  return {{a, a2, a1 * a2, trans_a},
          {b, b2, b1 * b2, trans_b},
          {out, n, m * n},
          {m, n, trans_a ? a1 : a2, batch}};
}

// Geometry of Note [packed attention] for qkv [B, T, 3C] and `heads` heads.
struct Packed {
  int64_t batch, t, c, heads, d;
  float scale;  // 1 / sqrt(D), as the CPU kernels compute it

  Packed(int64_t batch_, int64_t t_, int64_t three_c, int64_t heads_)
      : batch(batch_),
        t(t_),
        c(three_c / 3),
        heads(heads_),
        d(c / heads_),
        scale(1.0f / std::sqrt(static_cast<float>(d))) {}

  // Head 0 of q (part 0), k (1) or v (2) of batch element b in [B, T, 3C] data.
  template <typename T>
  OperandOf<T> head(const T* qkv, int64_t b, int part, bool trans = false) const {
    return {qkv + b * t * 3 * c + part * c, 3 * c, d, trans};
  }
  template <typename T>
  OutputOf<T> head_out(T* qkv, int64_t b, int part) const {
    return {qkv + b * t * 3 * c + part * c, 3 * c, d};
  }
  // Head 0 of y or grad_y ([B, T, C]) of batch element b.
  template <typename T>
  OperandOf<T> y_head(const T* y, int64_t b) const {
    return {y + b * t * c, c, d};
  }
  template <typename T>
  OutputOf<T> y_head_out(T* y, int64_t b) const {
    return {y + b * t * c, c, d};
  }
  // The heads' [T, T] matrices of batch element b in probs [B, H, T, T].
  int64_t probs_offset(int64_t b) const { return b * heads * t * t; }
  template <typename T>
  OperandOf<T> square(const T* p, bool trans = false) const {
    return {p, t, t * t, trans};
  }
  template <typename T>
  OutputOf<T> square_out(T* p) const {
    return {p, t, t * t};
  }
  GemmShape scores() const { return {t, t, d, heads}; }  // [T, D] x [D, T]
  GemmShape values() const { return {t, d, t, heads}; }  // [T, T] x [T, D]
};

// Ops: gemm(a, b, out, shape, alpha) (beta 0); causal_softmax(x, rows, t) in place over
// rows of [.., T, T] matrices; softmax_backward(grad, y, rows, d) in place into grad.
template <typename Ops>
void forward(const Packed& g, const float* qkv, float* y, float* probs, Ops& ops) {
  for (int64_t b = 0; b < g.batch; ++b) {
    ops.gemm(g.head(qkv, b, 0), g.head(qkv, b, 1, /*trans=*/true),
             g.square_out(probs + g.probs_offset(b)), g.scores(), g.scale);
  }
  ops.causal_softmax(probs, g.batch * g.heads * g.t, g.t);
  for (int64_t b = 0; b < g.batch; ++b) {
    ops.gemm(g.square(probs + g.probs_offset(b)), g.head(qkv, b, 2), g.y_head_out(y, b), g.values(),
             1.0f);
  }
}

// ds: scratch of heads * t * t floats.
template <typename Ops>
void backward(const Packed& g, const float* grad_y, const float* qkv, const float* probs, float* ds,
              float* grad_qkv, Ops& ops) {
  for (int64_t b = 0; b < g.batch; ++b) {
    const Operand dy = g.y_head(grad_y, b);
    const float* p = probs + g.probs_offset(b);
    ops.gemm(dy, g.head(qkv, b, 2, /*trans=*/true), g.square_out(ds), g.scores(), 1.0f);  // dP
    ops.gemm(g.square(p, /*trans=*/true), dy, g.head_out(grad_qkv, b, 2), g.values(),
             1.0f);                                   // dV
    ops.softmax_backward(ds, p, g.heads * g.t, g.t);  // dS, in place
    ops.gemm(g.square(ds), g.head(qkv, b, 1), g.head_out(grad_qkv, b, 0), g.values(),
             g.scale);  // dQ
    ops.gemm(g.square(ds, /*trans=*/true), g.head(qkv, b, 0), g.head_out(grad_qkv, b, 1),
             g.values(), g.scale);  // dK
  }
}

// Note [16-bit attention on cuda]: for bf16 (or f16) qkv the same products run on
// tensor cores (cublasGemmStridedBatchedEx, f32 accumulation). The scores and dP,
// which a softmax reads, are written in f32 into a [H, T, T] scratch reused for each
// batch element; the probabilities kept for the backward and dS, which the next
// products read, are stored in T (the 16-bit type): half the memory of f32 probs.
//   forward, per b:  S = q k^T / sqrt(D) (f32), P = causal_softmax(S) (T), y = P v
//   backward, per b: dP = dY v^T (f32), dV = P^T dY, dS = P (dP - rowsum(dP P)) (T),
//                    dQ = dS k / sqrt(D), dK = dS^T q / sqrt(D)
// Ops: gemm(a, b, out, shape, alpha) for any operand and output types, and
// causal_softmax(scores, rows, t, probs), softmax_backward(dp, probs, rows, t, ds).
template <typename T, typename Ops>
void forward16(const Packed& g, const T* qkv, T* y, T* probs, float* scores, Ops& ops) {
  for (int64_t b = 0; b < g.batch; ++b) {
    T* p = probs + g.probs_offset(b);
    ops.gemm(g.head(qkv, b, 0), g.head(qkv, b, 1, /*trans=*/true), g.square_out(scores), g.scores(),
             g.scale);
    ops.causal_softmax(scores, g.heads * g.t, g.t, p);
    ops.gemm(g.square(static_cast<const T*>(p)), g.head(qkv, b, 2), g.y_head_out(y, b), g.values(),
             1.0f);
  }
}

template <typename T, typename Ops>
void backward16(const Packed& g, const T* grad_y, const T* qkv, const T* probs, float* dp, T* ds,
                T* grad_qkv, Ops& ops) {
  for (int64_t b = 0; b < g.batch; ++b) {
    const OperandOf<T> dy = g.y_head(grad_y, b);
    const T* p = probs + g.probs_offset(b);
    ops.gemm(dy, g.head(qkv, b, 2, /*trans=*/true), g.square_out(dp), g.scores(), 1.0f);  // dP
    ops.gemm(g.square(p, /*trans=*/true), dy, g.head_out(grad_qkv, b, 2), g.values(),
             1.0f);                                       // dV
    ops.softmax_backward(dp, p, g.heads * g.t, g.t, ds);  // dS
    const T* cds = ds;
    ops.gemm(g.square(cds), g.head(qkv, b, 1), g.head_out(grad_qkv, b, 0), g.values(),
             g.scale);  // dQ
    ops.gemm(g.square(cds, /*trans=*/true), g.head(qkv, b, 0), g.head_out(grad_qkv, b, 1),
             g.values(), g.scale);  // dK
  }
}

}  // namespace ddp::kernels::attention_plan
