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

// Rows r0..r1-1 of the [T, T] scores in place: row i becomes the softmax of its
// columns 0..i, exact zeros after (as causal_softmax: no -inf mask, so no 0 * inf
// reaches the backward); columns past r1 were never computed and are only written.
void causal_softmax_rows(float* s, int64_t r0, int64_t r1, int64_t t) {
  for (int64_t i = r0; i < r1; ++i) {
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

// Note [causal blocks]
// ~~~~~~~~~~~~~~~~~~~~
// Row i of a head's [T, T] products only needs columns 0..i. The rows are taken in
// blocks of kRowBlock: block [r0, r1) multiplies against positions 0..r1-1 only, so the
// products shrink to (1 + 2 + ... + n) / n^2 of the square for n blocks (62.5% at
// T = 256, 53% at T = 1024) while each sgemm stays large enough to run at speed. The
// column products (dV = P^T dY, dK = dS^T Q) go by column block [c0, c1), which only
// rows c0.. reach. Entries a block skips are above the diagonal: the softmax (and its
// backward) writes their zeros.
constexpr int64_t kRowBlock = 64;

// Per (b, h): probs = causal_softmax(q k^T / sqrt(D)) computed in place in probs' [T, T]
// block, then y's columns h*D.. = probs v, by row blocks (Note [causal blocks]).
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
      float* out = y.data<float>() + g.y_offset(b, h);
      for (int64_t r0 = 0; r0 < t; r0 += kRowBlock) {
        const int64_t r1 = std::min(t, r0 + kRowBlock), rows = r1 - r0;
        sgemm(false, true, rows, r1, g.d, scale, q + r0 * 3 * c, 3 * c, q + c, 3 * c, 0.0f,
              p + r0 * t, t);
        causal_softmax_rows(p, r0, r1, t);
        sgemm(false, false, rows, g.d, r1, 1.0f, p + r0 * t, t, q + 2 * c, 3 * c, 0.0f,
              out + r0 * c, c);
      }
    }
  }
}

// Per (b, h), with dY the head's [T, D] block of grad_y:
//   dP = dY V^T, dV = P^T dY, dS = P * (dP - rowsum(dP * P)),
//   dQ = dS K / sqrt(D), dK = dS^T Q / sqrt(D),
// each written straight into its third of grad_qkv (leading dimension 3C), by row and
// column blocks (Note [causal blocks]).
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
      for (int64_t r0 = 0; r0 < t; r0 += kRowBlock) {  // dP, then dS, by row block
        const int64_t r1 = std::min(t, r0 + kRowBlock), rows = r1 - r0;
        sgemm(false, true, rows, r1, g.d, 1.0f, dy + r0 * c, c, q + 2 * c, 3 * c, 0.0f,
              ds.data() + r0 * t, t);
      }
      softmax_backward_rows(p, ds.data(), t);
      for (int64_t r0 = 0; r0 < t; r0 += kRowBlock) {  // dQ[r0:r1] = dS[r0:r1, :r1] K[:r1]
        const int64_t r1 = std::min(t, r0 + kRowBlock), rows = r1 - r0;
        sgemm(false, false, rows, g.d, r1, scale, ds.data() + r0 * t, t, q + c, 3 * c, 0.0f,
              dq + r0 * 3 * c, 3 * c);
      }
      for (int64_t c0 = 0; c0 < t; c0 += kRowBlock) {  // dV, dK [c0:c1] from rows c0..
        const int64_t cols = std::min(t, c0 + kRowBlock) - c0, rows = t - c0;
        sgemm(true, false, cols, g.d, rows, 1.0f, p + c0 * t + c0, t, dy + c0 * c, c, 0.0f,
              dq + 2 * c + c0 * 3 * c, 3 * c);
        sgemm(true, false, cols, g.d, rows, scale, ds.data() + c0 * t + c0, t, q + c0 * 3 * c,
              3 * c, 0.0f, dq + c + c0 * 3 * c, 3 * c);
      }
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
