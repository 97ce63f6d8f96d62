// The host side of bmm and the packed attention on CUDA (runtime/ops/cuda/
// attention_plan.h), replayed on the CPU: every cuBLAS call the plans make goes to a
// column-major reference sgemm with BLAS's semantics, which also checks the arguments
// cuBLAS would reject (leading dimensions) and that every element it touches lies
// inside one of the op's tensors; the softmaxes are plain loops. The results must
// match the CPU ops (bmm, causal_self_attention and its backward), so the row-major
// mapping, the head operands inside qkv and the order of the steps are checked here,
// and only cuBLAS and the softmax kernels themselves are left to the gpu tests.
#include "runtime/ops/cuda/attention_plan.h"

#include "runtime/ops/transformer_ops.h"
#include "runtime/tensor.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddp::kernels::attention_plan {
namespace {

struct Buffer {
  const float* begin;
  int64_t size;
};

// The Ops of attention_plan.h on the CPU.
struct ReplayOps {
  std::vector<Buffer> buffers;  // where the plan may read and write
  int gemms = 0;

  void expect_inside(const float* p) const {
    for (const Buffer& b : buffers) {
      if (p >= b.begin && p < b.begin + b.size) return;
    }
    ADD_FAILURE() << "an sgemm touches memory outside the op's tensors";
    throw std::runtime_error("out of bounds");
  }

  void gemm(const Operand& a, const Operand& b, const Output& out, const GemmShape& s,
            float alpha) {
    const ColumnMajorGemm g = column_major(a, b, out, s);
    ++gemms;
    // cuBLAS's argument checks (CUBLAS_STATUS_INVALID_VALUE otherwise).
    ASSERT_GE(g.lda, std::max<int64_t>(1, g.trans_a ? g.k : g.m));
    ASSERT_GE(g.ldb, std::max<int64_t>(1, g.trans_b ? g.n : g.k));
    ASSERT_GE(g.ldc, std::max<int64_t>(1, g.m));
    for (int64_t i = 0; i < g.batch; ++i) {
      const float* pa = g.a + i * g.stride_a;
      const float* pb = g.b + i * g.stride_b;
      float* pc = g.c + i * g.stride_c;
      for (int64_t col = 0; col < g.n; ++col) {
        for (int64_t row = 0; row < g.m; ++row) {
          double acc = 0.0;
          for (int64_t l = 0; l < g.k; ++l) {
            const float* ea = g.trans_a ? pa + l + row * g.lda : pa + row + l * g.lda;
            const float* eb = g.trans_b ? pb + col + l * g.ldb : pb + l + col * g.ldb;
            expect_inside(ea);
            expect_inside(eb);
            acc += static_cast<double>(*ea) * *eb;
          }
          float* ec = pc + row + col * g.ldc;
          expect_inside(ec);
          *ec = static_cast<float>(alpha * acc);
        }
      }
    }
  }

  void causal_softmax(float* x, int64_t rows, int64_t t) const {
    for (int64_t r = 0; r < rows; ++r) {
      float* row = x + r * t;
      const int64_t seen = r % t + 1;
      const float max = *std::max_element(row, row + seen);
      double sum = 0.0;
      for (int64_t j = 0; j < seen; ++j) sum += std::exp(static_cast<double>(row[j] - max));
      for (int64_t j = 0; j < seen; ++j) row[j] = static_cast<float>(std::exp(row[j] - max) / sum);
      std::fill(row + seen, row + t, 0.0f);
    }
  }

  void softmax_backward(float* grad, const float* y, int64_t rows, int64_t d) const {
    for (int64_t r = 0; r < rows; ++r) {
      double s = 0.0;
      for (int64_t j = 0; j < d; ++j) s += static_cast<double>(grad[r * d + j]) * y[r * d + j];
      for (int64_t j = 0; j < d; ++j) {
        grad[r * d + j] = y[r * d + j] * (grad[r * d + j] - static_cast<float>(s));
      }
    }
  }
};

// The Ops of forward16 / backward16 (Note [16-bit attention on cuda]) with float
// standing in for the 16-bit type: the same products and softmaxes, out of place.
struct ReplayOps16 : ReplayOps {
  void causal_softmax(const float* scores, int64_t rows, int64_t t, float* probs) const {
    std::copy(scores, scores + rows * t, probs);
    ReplayOps::causal_softmax(probs, rows, t);
  }
  void softmax_backward(const float* dp, const float* p, int64_t rows, int64_t d, float* ds) const {
    std::copy(dp, dp + rows * d, ds);
    ReplayOps::softmax_backward(ds, p, rows, d);
  }
};

Buffer buffer_of(const std::vector<float>& v) {
  return {v.data(), static_cast<int64_t>(v.size())};
}

void expect_close(const std::vector<float>& got, const Tensor& want, double tol,
                  const std::string& what) {
  const std::vector<float> w = want.to_vector<float>();
  ASSERT_EQ(got.size(), w.size()) << what;
  double scale = 0.0;
  for (float v : w) scale = std::max(scale, static_cast<double>(std::fabs(v)));
  for (size_t i = 0; i < w.size(); ++i) {
    ASSERT_NEAR(got[i], w[i], tol * (scale + 1e-30)) << what << " element " << i;
  }
}

TEST(AttentionPlan, BmmMatchesTheCpuOpForEveryTranspose) {
  uint64_t seed = 1;
  for (int trans = 0; trans < 4; ++trans) {
    const bool ta = (trans & 1) != 0, tb = (trans & 2) != 0;
    SCOPED_TRACE(::testing::Message() << "trans_a " << ta << " trans_b " << tb);
    const int64_t batch = 3, m = 5, k = 7, n = 4;
    const Tensor a = randn(ta ? Shape{batch, k, m} : Shape{batch, m, k}, ++seed);
    const Tensor b = randn(tb ? Shape{batch, n, k} : Shape{batch, k, n}, ++seed);
    const std::vector<float> va = a.to_vector<float>(), vb = b.to_vector<float>();
    std::vector<float> out(static_cast<size_t>(batch * m * n), std::nanf(""));
    ReplayOps ops{{buffer_of(va), buffer_of(vb), buffer_of(out)}};
    const Gemm g = bmm_gemm(va.data(), a.size(1), a.size(2), ta, vb.data(), b.size(1), b.size(2),
                            tb, out.data(), batch, m, n);
    ops.gemm(g.a, g.b, g.out, g.shape, 0.5f);
    expect_close(out, bmm(a, b, {.trans_a = ta, .trans_b = tb, .alpha = 0.5f}), 1e-5, "bmm");
  }
}

TEST(AttentionPlan, PackedAttentionMatchesTheCpuKernelsForwardAndBackward) {
  struct Case {
    int64_t b, t, c, heads;
  };
  uint64_t seed = 10;
  for (const Case& k :
       {Case{2, 5, 12, 3}, Case{3, 1, 8, 2}, Case{1, 9, 16, 1}, Case{2, 17, 24, 4}}) {
    SCOPED_TRACE(::testing::Message()
                 << "B=" << k.b << " T=" << k.t << " C=" << k.c << " heads=" << k.heads);
    const Tensor qkv = randn({k.b, k.t, 3 * k.c}, ++seed);
    const Tensor grad_y = randn({k.b, k.t, k.c}, ++seed);
    const AttentionResult want = causal_self_attention(qkv, k.heads);
    const Tensor want_grad = causal_self_attention_backward(grad_y, qkv, want.probs, k.heads);

    const Packed g(k.b, k.t, 3 * k.c, k.heads);
    const std::vector<float> x = qkv.to_vector<float>(), gy = grad_y.to_vector<float>();
    // NaN-filled outputs: anything the plan fails to write shows.
    std::vector<float> y(static_cast<size_t>(k.b * k.t * k.c), std::nanf(""));
    std::vector<float> probs(static_cast<size_t>(k.b * k.heads * k.t * k.t), std::nanf(""));
    std::vector<float> ds(static_cast<size_t>(k.heads * k.t * k.t), std::nanf(""));
    std::vector<float> grad_qkv(x.size(), std::nanf(""));
    ReplayOps ops{{buffer_of(x), buffer_of(y), buffer_of(probs)}};
    forward(g, x.data(), y.data(), probs.data(), ops);
    EXPECT_EQ(ops.gemms, 2 * k.b) << "one strided batched sgemm per product and batch element";
    expect_close(y, want.y, 1e-5, "y");
    expect_close(probs, want.probs, 1e-5, "probs");

    ReplayOps back{
        {buffer_of(gy), buffer_of(x), buffer_of(probs), buffer_of(ds), buffer_of(grad_qkv)}};
    backward(g, gy.data(), x.data(), probs.data(), ds.data(), grad_qkv.data(), back);
    expect_close(grad_qkv, want_grad, 1e-5, "grad_qkv");
  }
}

// The 16-bit sequence (forward16 / backward16) replayed with floats: the same values
// as the CPU attention, so its geometry (heads, scratch, which buffer each product
// reads) is the f32 plan's.
TEST(AttentionPlan, SixteenBitSequenceMatchesTheCpuKernels) {
  uint64_t seed = 40;
  for (const auto& [b, t, c, heads] :
       std::vector<std::array<int64_t, 4>>{{2, 5, 12, 3}, {1, 9, 16, 1}, {2, 17, 24, 4}}) {
    SCOPED_TRACE(::testing::Message() << "B=" << b << " T=" << t << " C=" << c);
    const Tensor qkv = randn({b, t, 3 * c}, ++seed), grad_y = randn({b, t, c}, ++seed);
    const AttentionResult want = causal_self_attention(qkv, heads);
    const Tensor want_grad = causal_self_attention_backward(grad_y, qkv, want.probs, heads);
    const Packed g(b, t, 3 * c, heads);
    const std::vector<float> x = qkv.to_vector<float>(), gy = grad_y.to_vector<float>();
    std::vector<float> y(static_cast<size_t>(b * t * c), std::nanf(""));
    std::vector<float> probs(static_cast<size_t>(b * heads * t * t), std::nanf(""));
    std::vector<float> scratch(static_cast<size_t>(heads * t * t), std::nanf(""));
    std::vector<float> ds(scratch.size(), std::nanf("")), grad_qkv(x.size(), std::nanf(""));
    ReplayOps16 ops;
    ops.buffers = {buffer_of(x), buffer_of(y), buffer_of(probs), buffer_of(scratch)};
    forward16(g, x.data(), y.data(), probs.data(), scratch.data(), ops);
    EXPECT_EQ(ops.gemms, 2 * b);
    expect_close(y, want.y, 1e-5, "y");
    expect_close(probs, want.probs, 1e-5, "probs");
    ReplayOps16 back;
    back.buffers = {buffer_of(gy),      buffer_of(x),  buffer_of(probs),
                    buffer_of(scratch), buffer_of(ds), buffer_of(grad_qkv)};
    backward16(g, gy.data(), x.data(), probs.data(), scratch.data(), ds.data(), grad_qkv.data(),
               back);
    EXPECT_EQ(back.gemms, 4 * b);
    expect_close(grad_qkv, want_grad, 1e-5, "grad_qkv");
  }
}

}  // namespace
}  // namespace ddp::kernels::attention_plan
