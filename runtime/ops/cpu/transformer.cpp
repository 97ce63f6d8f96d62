// CPU kernels of the transformer ops: GELU (tanh approximation), LayerNorm over
// the last dim, embedding lookup and its scatter-add, softmax / log-softmax along
// the last dim, batched matmul (one OpenBLAS sgemm per matrix), causal softmax.
// Row statistics accumulate in double: rows are up to a few thousand
// wide (d_model, vocabulary) and f32 sums of that length lose digits the finite
// difference tests and the PyTorch parity tests would see.
#include "runtime/ops/cpu/clones.h"
#include "runtime/ops/kernels.h"

#include <cblas.h>

#include <algorithm>
#include <bit>
#include <climits>
#include <cmath>
#include <cstdint>

namespace ddp::kernels::cpu {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

// The last dim of x and the number of rows before it (x viewed as [rows, d]).
struct Rows {
  int64_t rows, d;
};
Rows rows_of(const Tensor& x) {
  const int64_t d = x.size(-1);
  return {d == 0 ? 0 : x.numel() / d, d};
}

// Note [gelu tanh]
// ~~~~~~~~~~~~~~~~
// std::tanh is a scalar libm call (~20 ns): it made GELU and its backward 28% of a
// gpt-mini training step. GELU needs 1 + tanh(u) and 1 - tanh(u)^2, both simple in
// e = exp(-2|u|) in (0, 1] (tanh_parts), and exp is computed by range reduction:
// 2^n p(r), n = round(y / ln 2), r = y - n ln 2 (ln 2 split in two so r is exact), p the
// degree-7 Taylor polynomial (|r| <= ln 2 / 2: truncation error < 6e-9), 2^n built in
// the exponent bits. Every step is plain float
// arithmetic, so the loops vectorize on any x86-64 (rounding by the 1.5 * 2^23 trick,
// not floor, which needs SSE4.1; the file is built with -fno-trapping-math, without
// which GCC keeps the selects as branches, runtime/CMakeLists.txt). Against GELU in double the
// error stays at float rounding (tests/unit/transformer_ops_test.cpp), in the far
// left tail too, where 1 + std::tanh(u) rounds to 0.
inline float exp_nonpositive(float y) {
  y = std::max(y, -87.0f);  // 2^n stays a normal float; exp(-87) is 1.6e-38
  constexpr float kLog2e = 1.44269504f, kLn2Hi = 0.693145752f, kLn2Lo = 1.42860677e-6f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float n = (y * kLog2e + kRound) - kRound;
  const float r = (y - n * kLn2Hi) - n * kLn2Lo;
  const float p =
      1.0f +
      r * (1.0f +
           r * (0.5f +
                r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 + r * (1.0f / 720 + r / 5040))))));
  const auto bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  return p * std::bit_cast<float>(bits);
}

// 1 + tanh(u) and 1 - tanh(u)^2 without forming tanh: with e = exp(-2|u|) and
// q = 2 / (1 + e), 1 + tanh(u) is q for u >= 0 and q e for u < 0 (no 1 + t cancelling
// to 0 where GELU's left tail is ~1e-7), and 1 - tanh(u)^2 = q^2 e.
struct TanhParts {
  float one_plus, sech2;
};
inline TanhParts tanh_parts(float u) {
  const float e = exp_nonpositive(-2.0f * std::fabs(u));
  const float q = 2.0f / (1.0f + e);
  return {u >= 0.0f ? q : q * e, q * q * e};
}

}  // namespace

DDP_CPU_CLONES
void gelu(const Tensor& x, Tensor& out) {
  const float* p = x.data<float>();
  float* z = out.data<float>();
  for (int64_t i = 0, n = x.numel(); i < n; ++i) {
    const float v = p[i];
    z[i] = 0.5f * v * tanh_parts(kSqrt2OverPi * (v + kGeluCubic * v * v * v)).one_plus;
  }
}

// d/dx of 0.5 x (1 + tanh(u)), u = k (x + c x^3): 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 c x^2).
DDP_CPU_CLONES
void gelu_backward(const Tensor& grad, const Tensor& x, Tensor& out) {
  const float* g = grad.data<float>();
  const float* p = x.data<float>();
  float* z = out.data<float>();
  for (int64_t i = 0, n = x.numel(); i < n; ++i) {
    const float v = p[i];
    const TanhParts t = tanh_parts(kSqrt2OverPi * (v + kGeluCubic * v * v * v));
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * v * v);
    z[i] = g[i] * (0.5f * t.one_plus + 0.5f * v * t.sech2 * du);
  }
}

namespace {

// Note [row sums in lanes]: sum over j in [0, d) of f(j) in double, as kLanes
// interleaved partial sums (lane l takes j = l, l + kLanes, ...) added by a fixed tree
// at the end, then the d mod kLanes last terms. One running double sum is a chain of
// dependent adds (3-4 cycles each, never vectorized: the compiler may not reorder
// floating-point adds); kLanes independent ones are one vector of adds. The order
// depends only on d: the same bits every run.
constexpr int64_t kLanes = 8;
DDP_CPU_INLINE double lane_tree(const double* lane) {
  return ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7]));
}
template <typename F>
DDP_CPU_INLINE double lane_sum(int64_t d, F f) {
  double lane[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= d; j += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) lane[l] += f(j + l);
  }
  double sum = lane_tree(lane);
  for (; j < d; ++j) sum += f(j);
  return sum;
}

// One row of layer_norm: two passes over src (var = E[(x - mu)^2] does not cancel like
// E[x^2] - mu^2), the sums in double (Note [row sums in lanes]).
DDP_CPU_INLINE void norm_row(const float* src, int64_t d, const float* w, const float* b, float eps,
                             float* dst, float& mean, float& rstd) {
  const double sum = lane_sum(d, [src](int64_t j) { return static_cast<double>(src[j]); });
  const double mu = sum / static_cast<double>(d);
  const double sq = lane_sum(d, [src, mu](int64_t j) { return (src[j] - mu) * (src[j] - mu); });
  const auto inv = static_cast<float>(1.0 / std::sqrt(sq / static_cast<double>(d) + eps));
  const auto m = static_cast<float>(mu);
  for (int64_t j = 0; j < d; ++j) dst[j] = (src[j] - m) * inv * w[j] + b[j];
  mean = m;
  rstd = inv;
}

}  // namespace

DDP_CPU_CLONES
void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps, Tensor& out,
                Tensor& mean, Tensor& rstd) {
  const auto [rows, d] = rows_of(x);
  const float* w = weight.data<float>();
  const float* b = bias.data<float>();
  const float* src = x.data<float>();
  float* dst = out.data<float>();
  float* mu = mean.data<float>();
  float* inv = rstd.data<float>();
  for (int64_t r = 0; r < rows; ++r)
    norm_row(src + r * d, d, w, b, eps, dst + r * d, mu[r], inv[r]);
}

// Each row's sum is written and then normalized while it is still in the cache: the
// same bits as add then layer_norm (Note [residual layer norm] in transformer_ops.h).
DDP_CPU_CLONES
void residual_layer_norm(const Tensor& x, const Tensor& y, const Tensor& weight, const Tensor& bias,
                         float eps, Tensor& sum, Tensor& out, Tensor& mean, Tensor& rstd) {
  const auto [rows, d] = rows_of(x);
  const float* w = weight.data<float>();
  const float* b = bias.data<float>();
  const float* a = x.data<float>();
  const float* c = y.data<float>();
  float* s = sum.data<float>();
  float* dst = out.data<float>();
  float* mu = mean.data<float>();
  float* inv = rstd.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = r * d; j < (r + 1) * d; ++j) s[j] = a[j] + c[j];
    norm_row(s + r * d, d, w, b, eps, dst + r * d, mu[r], inv[r]);
  }
}

// With xhat = (x - mean) rstd and dxhat = grad * weight:
// grad_x = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)),
// grad_weight = sum over rows of grad xhat, grad_bias = sum over rows of grad.
// accumulate: grad_x holds a waiting gradient w and becomes w + x's gradient, one
// rounding (Note [accumulating into a pending gradient]; -ffp-contract=off keeps the
// product and the add apart, as the engine's add would).
DDP_CPU_CLONES
void layer_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& mean,
                         const Tensor& rstd, const Tensor& weight, Tensor& grad_x,
                         Tensor& grad_weight, Tensor& grad_bias, bool accumulate) {
  const auto [rows, d] = rows_of(x);
  const float* w = weight.data<float>();
  float* gw = grad_weight.data<float>();
  float* gb = grad_bias.data<float>();
  std::fill(gw, gw + d, 0.0f);
  std::fill(gb, gb + d, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = grad.data<float>() + r * d;
    const float* src = x.data<float>() + r * d;
    float* dst = grad_x.data<float>() + r * d;
    const float mu = mean.data<float>()[r], inv = rstd.data<float>()[r];
    for (int64_t j = 0; j < d; ++j) {
      gw[j] += g[j] * ((src[j] - mu) * inv);
      gb[j] += g[j];
    }
    // Note [row sums in lanes].
    // Two passes of lanes, each a vector of independent adds (one pass filling two
    // sets of lanes measured slower at -O3 on Zen 4).
    const double sum_dxhat =
        lane_sum(d, [g, w](int64_t j) { return static_cast<double>(g[j] * w[j]); });
    const double sum_dxhat_xhat = lane_sum(d, [g, w, src, mu, inv](int64_t j) {
      return static_cast<double>(g[j] * w[j]) * ((src[j] - mu) * inv);
    });
    const auto mean_dxhat = static_cast<float>(sum_dxhat / static_cast<double>(d));
    const auto mean_dxhat_xhat = static_cast<float>(sum_dxhat_xhat / static_cast<double>(d));
    for (int64_t j = 0; j < d; ++j) {
      const float xhat = (src[j] - mu) * inv;
      const float v = inv * (g[j] * w[j] - mean_dxhat - xhat * mean_dxhat_xhat);
      dst[j] = accumulate ? dst[j] + v : v;
    }
  }
}

void embedding(const Tensor& weight, const Tensor& indices, Tensor& out) {
  const int64_t vocab = weight.size(0), d = weight.size(1);
  const float* table = weight.data<float>();
  const int64_t* index = indices.data<int64_t>();
  float* dst = out.data<float>();
  for (int64_t i = 0, n = indices.numel(); i < n; ++i) {
    DDP_CHECK(index[i] >= 0 && index[i] < vocab,
              "embedding: index {} at position {} is outside the table of {} rows (valid: 0 to "
              "{}); check the tokenizer's vocabulary against the model's vocab_size",
              index[i], i, vocab, vocab - 1);
    std::copy(table + index[i] * d, table + (index[i] + 1) * d, dst + i * d);
  }
}

// Rows are summed in position order, so repeated indices accumulate deterministically.
void embedding_backward(const Tensor& grad, const Tensor& indices, Tensor& grad_weight) {
  const int64_t vocab = grad_weight.size(0), d = grad_weight.size(1);
  const float* g = grad.data<float>();
  const int64_t* index = indices.data<int64_t>();
  float* dst = grad_weight.data<float>();
  std::fill(dst, dst + grad_weight.numel(), 0.0f);
  for (int64_t i = 0, n = indices.numel(); i < n; ++i) {
    DDP_CHECK(index[i] >= 0 && index[i] < vocab,
              "embedding_backward: index {} at position {} is outside the table of {} rows",
              index[i], i, vocab);
    float* row = dst + index[i] * d;
    for (int64_t j = 0; j < d; ++j) row[j] += g[i * d + j];
  }
}

namespace {

// Softmax (or log-softmax) of src[0, d) into dst[0, d); d >= 1.
// Subtracting the row maximum keeps exp() <= 1: logits of 1e4 stay finite.
DDP_CPU_INLINE void softmax_row(const float* src, int64_t d, bool log, float* dst) {
  const float max = *std::max_element(src, src + d);
  double sum = 0.0;
  for (int64_t j = 0; j < d; ++j) sum += std::exp(static_cast<double>(src[j] - max));
  if (log) {
    const auto log_sum = static_cast<float>(std::log(sum));
    for (int64_t j = 0; j < d; ++j) dst[j] = src[j] - max - log_sum;
  } else {
    const auto inv = static_cast<float>(1.0 / sum);
    for (int64_t j = 0; j < d; ++j) dst[j] = std::exp(src[j] - max) * inv;
  }
}

}  // namespace

DDP_CPU_CLONES
void softmax(const Tensor& x, bool log, Tensor& out) {
  const auto [rows, d] = rows_of(x);
  for (int64_t r = 0; r < rows; ++r) {
    softmax_row(x.data<float>() + r * d, d, log, out.data<float>() + r * d);
  }
}

// Row r is row i = r % T of its matrix: the softmax of columns 0..i, exact zeros
// after (not exp(-inf) of a -inf mask, so no 0 * inf can reach the backward).
DDP_CPU_CLONES
void causal_softmax(const Tensor& x, Tensor& out) {
  const auto [rows, t] = rows_of(x);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t seen = r % t + 1;
    float* dst = out.data<float>() + r * t;
    softmax_row(x.data<float>() + r * t, seen, false, dst);
    std::fill(dst + seen, dst + t, 0.0f);
  }
}

// One sgemm per matrix: Debian 12's OpenBLAS (0.3.21) has no strided batched sgemm,
// and the matrices of attention ([T, D] x [D, T]) are big enough that the call
// overhead does not matter.
void bmm(const Tensor& a, const Tensor& b, Tensor& out, bool trans_a, bool trans_b, float alpha) {
  const int64_t batch = out.size(0), m = out.size(1), n = out.size(2);
  const int64_t k = trans_a ? a.size(1) : a.size(2);
  DDP_CHECK(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX,
            "bmm: dimensions m={} n={} k={} exceed the BLAS limit of {}", m, n, k, INT_MAX);
  const int64_t a_step = a.size(1) * a.size(2), b_step = b.size(1) * b.size(2);
  const int lda = static_cast<int>(std::max<int64_t>(a.size(2), 1));
  const int ldb = static_cast<int>(std::max<int64_t>(b.size(2), 1));
  for (int64_t i = 0; i < batch; ++i) {
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(k), alpha, a.data<float>() + i * a_step, lda,
                b.data<float>() + i * b_step, ldb, 0.0f, out.data<float>() + i * m * n,
                static_cast<int>(std::max<int64_t>(n, 1)));
  }
}

DDP_CPU_CLONES
void softmax_backward(const Tensor& grad, const Tensor& y, bool log, Tensor& grad_x) {
  const auto [rows, d] = rows_of(y);
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = grad.data<float>() + r * d;
    const float* out = y.data<float>() + r * d;
    float* dst = grad_x.data<float>() + r * d;
    double acc = 0.0;  // softmax: sum(grad y); log-softmax: sum(grad)
    for (int64_t j = 0; j < d; ++j) acc += log ? g[j] : static_cast<double>(g[j]) * out[j];
    const auto s = static_cast<float>(acc);
    if (log) {
      for (int64_t j = 0; j < d; ++j) dst[j] = g[j] - std::exp(out[j]) * s;
    } else {
      for (int64_t j = 0; j < d; ++j) dst[j] = out[j] * (g[j] - s);
    }
  }
}

}  // namespace ddp::kernels::cpu
