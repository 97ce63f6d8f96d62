// CPU kernels of the packed causal self-attention (Note [packed attention] in
// ops/transformer_ops.h) and the sum of squares behind gradient-norm clipping.
#include "runtime/ops/kernels.h"

#include <cblas.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <vector>

namespace ddp::kernels::cpu {

namespace {

// One (b, h) of the packed layout (Note [packed attention]): q, k and v are [T, D]
// matrices inside qkv with leading dimension 3C; y and grad_y are [T, D] matrices with
// leading dimension C; probs is the [T, T] matrix of the pair.
struct Head {
  int64_t t, d, c;
  int64_t qkv_offset(int64_t b, int64_t h) const { return b * t * 3 * c + h * d; }
  int64_t y_offset(int64_t b, int64_t h) const { return b * t * c + h * d; }
};

// out[M, N] = alpha op(a) op(b) + beta out, row-major with explicit leading dimensions.
void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* out, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              out, static_cast<int>(ldc));
}

void check_blas_limits(const char* op, const Head& g) {
  DDP_CHECK(3 * g.c <= INT_MAX && g.t * g.t <= INT_MAX,
            "{}: T = {} and C = {} exceed the BLAS limit of {} (3C and T*T must fit in int)", op,
            g.t, g.c, INT_MAX);
}

// Row i of the [T, T] scores in place: softmax of columns 0..i, exact zeros after
// (as causal_softmax: no -inf mask, so no 0 * inf reaches the backward).
void causal_softmax_rows(float* s, int64_t t) {
  for (int64_t i = 0; i < t; ++i) {
    float* row = s + i * t;
    const float max = *std::max_element(row, row + i + 1);
    double sum = 0.0;
    for (int64_t j = 0; j <= i; ++j) sum += std::exp(static_cast<double>(row[j] - max));
    const auto inv = static_cast<float>(1.0 / sum);
    for (int64_t j = 0; j <= i; ++j) row[j] = std::exp(row[j] - max) * inv;
    std::fill(row + i + 1, row + t, 0.0f);
  }
}

// dP in place -> dS = P * (dP - rowsum(dP * P)) (softmax's backward), zeros above the
// diagonal, where P is 0.
void softmax_backward_rows(const float* p, float* dp, int64_t t) {
  for (int64_t i = 0; i < t; ++i) {
    const float* prow = p + i * t;
    float* row = dp + i * t;
    double dot = 0.0;
    for (int64_t j = 0; j <= i; ++j) dot += static_cast<double>(row[j]) * prow[j];
    const auto s = static_cast<float>(dot);
    for (int64_t j = 0; j <= i; ++j) row[j] = prow[j] * (row[j] - s);
    std::fill(row + i + 1, row + t, 0.0f);
  }
}

}  // namespace

// Per (b, h): probs = causal_softmax(q k^T / sqrt(D)) computed in place in probs' [T, T]
// block, then y's columns h*D.. = probs v. All of q k^T is computed (sgemm has no
// triangular form for this product); the softmax overwrites the upper triangle with zeros.
void attention_forward(const Tensor& qkv, int64_t heads, Tensor& y, Tensor& probs) {
  const int64_t b_size = qkv.size(0), t = qkv.size(1), c = qkv.size(2) / 3;
  const Head g{t, c / heads, c};
  check_blas_limits("causal_self_attention", g);
  const float scale = 1.0f / std::sqrt(static_cast<float>(g.d));
  const float* base = qkv.data<float>();
  for (int64_t b = 0; b < b_size; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      const float* q = base + g.qkv_offset(b, h);
      float* p = probs.data<float>() + (b * heads + h) * t * t;
      sgemm(false, true, t, t, g.d, scale, q, 3 * c, q + c, 3 * c, 0.0f, p, t);
      causal_softmax_rows(p, t);
      sgemm(false, false, t, g.d, t, 1.0f, p, t, q + 2 * c, 3 * c, 0.0f,
            y.data<float>() + g.y_offset(b, h), c);
    }
  }
}

// Per (b, h), with dY the head's [T, D] block of grad_y:
//   dP = dY V^T, dV = P^T dY, dS = P * (dP - rowsum(dP * P)),
//   dQ = dS K / sqrt(D), dK = dS^T Q / sqrt(D),
// each written straight into its third of grad_qkv (leading dimension 3C).
void attention_backward(const Tensor& grad_y, const Tensor& qkv, const Tensor& probs, int64_t heads,
                        Tensor& grad_qkv) {
  const int64_t b_size = qkv.size(0), t = qkv.size(1), c = qkv.size(2) / 3;
  const Head g{t, c / heads, c};
  check_blas_limits("causal_self_attention_backward", g);
  const float scale = 1.0f / std::sqrt(static_cast<float>(g.d));
  std::vector<float> ds(static_cast<size_t>(t * t));
  for (int64_t b = 0; b < b_size; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      const float* q = qkv.data<float>() + g.qkv_offset(b, h);
      const float* dy = grad_y.data<float>() + g.y_offset(b, h);
      const float* p = probs.data<float>() + (b * heads + h) * t * t;
      float* dq = grad_qkv.data<float>() + g.qkv_offset(b, h);
      sgemm(false, true, t, t, g.d, 1.0f, dy, c, q + 2 * c, 3 * c, 0.0f, ds.data(), t);
      sgemm(true, false, t, g.d, t, 1.0f, p, t, dy, c, 0.0f, dq + 2 * c, 3 * c);
      softmax_backward_rows(p, ds.data(), t);
      sgemm(false, false, t, g.d, t, scale, ds.data(), t, q + c, 3 * c, 0.0f, dq, 3 * c);
      sgemm(true, false, t, g.d, t, scale, ds.data(), t, q, 3 * c, 0.0f, dq + c, 3 * c);
    }
  }
}

// Blocks of 16 independent f32 lanes (so the loop vectorizes and no add waits for the
// previous one), each block's lanes folded into a double: a block is short enough for
// f32, and the double total keeps a 100M-element gradient exact to f32 precision.
void sum_squares(const Tensor& x, Tensor& out) {
  constexpr int64_t kLanes = 16, kBlock = 1024;
  const float* p = x.data<float>();
  const int64_t n = x.numel();
  double total = 0.0;
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t end = std::min(n, start + kBlock);
    std::array<float, kLanes> lanes{};
    int64_t i = start;
    for (; i + kLanes <= end; i += kLanes)
      for (int64_t l = 0; l < kLanes; ++l) lanes[l] += p[i + l] * p[i + l];
    double block = 0.0;
    for (; i < end; ++i) block += static_cast<double>(p[i]) * p[i];
    for (float lane : lanes) block += lane;
    total += block;
  }
  *out.data<float>() = static_cast<float>(total);
}

}  // namespace ddp::kernels::cpu
