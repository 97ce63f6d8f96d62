// The host side of the cuBLASLt linear layer (runtime/ops/cuda/lt_plan.h, Note
// [cublasLt linear]) replayed on the CPU: a column-major reference matmul with
// cuBLASLt's semantics (op(A) [m, k] op(B) [k, n] + bias[row]) reads the operands
// through the plan's layouts, checks the leading dimensions cuBLASLt would reject and
// that every element it touches lies inside its tensor, and must reproduce the CPU's
// row-major matmul and linear ops. Only cuBLASLt itself is left to the gpu tests.
#include "runtime/ops/cuda/lt_plan.h"

#include "runtime/ops/ops.h"
#include "runtime/ops/transformer_ops.h"
#include "runtime/tensor.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

namespace ddp::kernels::lt_plan {
namespace {

// GPT-2's GELU (tanh form) and its derivative, in double.
double gelu_tanh(double v) {
  return 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
}
double gelu_tanh_grad(double v) {
  const double k = std::sqrt(2.0 / M_PI), t = std::tanh(k * (v + 0.044715 * v * v * v));
  return 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * v * v);
}

// D = op(A) op(B) (+ bias per row of D), column-major, in double; A is cuBLASLt's
// first operand (our second), B its second (our first). With a BGRADB epilogue,
// *bias_grad gets the sums of op(B) over k, one per column of D. Note [gelu epilogues]:
// with gelu, *aux gets the sum before the GELU and D its GELU; with dgelu, D is the
// product times gelu'(*aux), read through the plan's aux layout.
std::vector<float> replay(const Plan& p, const std::vector<float>& a, const std::vector<float>& b,
                          const std::vector<float>& bias, std::vector<float>* bias_grad = nullptr,
                          std::vector<float>* aux = nullptr) {
  if (p.gelu || p.dgelu) {
    EXPECT_GE(p.aux.ld, std::max<int64_t>(1, p.m));
    EXPECT_EQ(p.aux.ld % 8, 0) << "cuBLASLt's rule for the GELU aux matrix";
    EXPECT_EQ(p.aux.rows, p.m);
    EXPECT_EQ(p.aux.cols, p.n);
  }
  if (p.gelu) aux->assign(static_cast<size_t>(p.aux.ld * p.aux.cols), NAN);
  EXPECT_GE(p.a.ld, std::max<int64_t>(1, p.a.rows));
  EXPECT_GE(p.b.ld, std::max<int64_t>(1, p.b.rows));
  EXPECT_GE(p.d.ld, std::max<int64_t>(1, p.d.rows));
  // op(A) is m x k, op(B) k x n, D m x n.
  EXPECT_EQ(p.trans_a ? p.a.cols : p.a.rows, p.m);
  EXPECT_EQ(p.trans_a ? p.a.rows : p.a.cols, p.k);
  EXPECT_EQ(p.trans_b ? p.b.cols : p.b.rows, p.k);
  EXPECT_EQ(p.trans_b ? p.b.rows : p.b.cols, p.n);
  EXPECT_EQ(p.d.rows, p.m);
  EXPECT_EQ(p.d.cols, p.n);
  std::vector<float> d(static_cast<size_t>(p.d.ld * p.d.cols), NAN);
  for (int64_t j = 0; j < p.n; ++j) {
    for (int64_t i = 0; i < p.m; ++i) {
      double acc = p.bias_length > 0 ? bias.at(static_cast<size_t>(i)) : 0.0;
      for (int64_t l = 0; l < p.k; ++l) {
        acc += static_cast<double>(a.at(static_cast<size_t>(at(p.a, p.trans_a, i, l)))) *
               b.at(static_cast<size_t>(at(p.b, p.trans_b, l, j)));
      }
      if (p.gelu) {
        aux->at(static_cast<size_t>(at(p.aux, false, i, j))) = static_cast<float>(acc);
        acc = gelu_tanh(acc);
      } else if (p.dgelu) {
        acc *= gelu_tanh_grad(aux->at(static_cast<size_t>(at(p.aux, false, i, j))));
      }
      d.at(static_cast<size_t>(at(p.d, false, i, j))) = static_cast<float>(acc);
    }
  }
  if (p.bias_grad_length > 0) {
    EXPECT_EQ(p.bias_grad_length, p.n);
    bias_grad->assign(static_cast<size_t>(p.n), 0.0f);
    for (int64_t j = 0; j < p.n; ++j) {
      double acc = 0.0;
      for (int64_t l = 0; l < p.k; ++l) acc += b.at(static_cast<size_t>(at(p.b, p.trans_b, l, j)));
      (*bias_grad)[static_cast<size_t>(j)] = static_cast<float>(acc);
    }
  }
  return d;
}

void expect_close(const std::vector<float>& got, const Tensor& want) {
  const auto w = want.to_vector<float>();
  ASSERT_EQ(got.size(), w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    ASSERT_NEAR(got[i], w[i], 1e-4 * (1.0 + std::fabs(w[i]))) << "element " << i;
  }
}

TEST(LtPlan, LinearReplaysAsTheCpuLinear) {
  for (const auto& [rows, in, out] :
       std::vector<std::array<int64_t, 3>>{{1, 1, 1}, {7, 5, 3}, {4, 16, 9}, {32, 24, 40}}) {
    for (bool with_bias : {false, true}) {
      const Tensor x = randn({rows, in}, 1), w = randn({out, in}, 2), b = randn({out}, 3);
      const Plan p = linear_plan(rows, in, out, with_bias);
      EXPECT_EQ(p.bias_length, with_bias ? out : 0);
      const auto d = replay(p, w.to_vector<float>(), x.to_vector<float>(), b.to_vector<float>());
      expect_close(d, linear(x, w, with_bias ? b : Tensor()));
    }
  }
}

// Note [weight gradient epilogue]: the plan's D is the CPU's weight gradient
// matmul(g, x, trans_a) and its BGRADB sums are the CPU's bias gradient sum(g, 0).
TEST(LtPlan, WeightGradientAndItsBiasEpilogueReplayAsTheCpu) {
  for (const auto& [rows, in, out] :
       std::vector<std::array<int64_t, 3>>{{1, 1, 1}, {7, 5, 3}, {4, 16, 9}, {32, 24, 40}}) {
    const Tensor g = randn({rows, out}, 6), x = randn({rows, in}, 7);
    const Plan p = weight_grad_plan(rows, in, out, true);
    EXPECT_EQ(p.bias_length, 0);
    std::vector<float> bias_grad;
    const auto d = replay(p, x.to_vector<float>(), g.to_vector<float>(), {}, &bias_grad);
    expect_close(d, matmul(g, x, {.trans_a = true}));
    expect_close(bias_grad, sum(g, 0));
    EXPECT_EQ(weight_grad_plan(rows, in, out, false).bias_grad_length, 0);
  }
}

// Note [gelu epilogues]: c_fc's matmul with GELU_AUX_BIAS gives the CPU's
// gelu(linear(...)) and keeps linear(...) as aux; the DGELU matmul over c_proj's
// weight gives gelu_backward(grad weight, pre).
TEST(LtPlan, GeluEpiloguesReplayAsTheCpuOps) {
  for (const auto& [rows, in, hidden, out] :
       std::vector<std::array<int64_t, 4>>{{1, 1, 8, 1}, {7, 5, 16, 3}, {12, 8, 32, 8}}) {
    const Tensor x = randn({rows, in}, 31), w_fc = randn({hidden, in}, 32);
    const Tensor b_fc = randn({hidden}, 33), w_proj = randn({out, hidden}, 34);
    const Tensor g = randn({rows, out}, 35);
    const Plan f = linear_gelu_plan(rows, in, hidden);
    EXPECT_TRUE(f.gelu);
    EXPECT_EQ(f.bias_length, hidden);
    std::vector<float> pre;
    const auto h = replay(f, w_fc.to_vector<float>(), x.to_vector<float>(), b_fc.to_vector<float>(),
                          nullptr, &pre);
    const Tensor want_pre = linear(x, w_fc, b_fc);
    expect_close(pre, want_pre);
    expect_close(h, gelu(want_pre));
    const Plan bwd = input_grad_dgelu_plan(rows, out, hidden);
    EXPECT_TRUE(bwd.dgelu);
    EXPECT_EQ(bwd.aux.ld, hidden);
    const auto dpre =
        replay(bwd, w_proj.to_vector<float>(), g.to_vector<float>(), {}, nullptr, &pre);
    expect_close(dpre, gelu_backward(matmul(g, w_proj), want_pre));
  }
}

TEST(LtPlan, EveryTranspositionReplaysAsTheCpuMatmul) {
  const int64_t m = 6, n = 5, k = 7;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const Tensor a = randn(ta ? Shape{k, m} : Shape{m, k}, 4);
      const Tensor b = randn(tb ? Shape{n, k} : Shape{k, n}, 5);
      const Plan p = gemm_plan(a.size(0), a.size(1), ta, b.size(0), b.size(1), tb, false);
      const auto d = replay(p, b.to_vector<float>(), a.to_vector<float>(), {});
      expect_close(d, matmul(a, b, {.trans_a = ta, .trans_b = tb}));
    }
  }
}

TEST(LtPlan, AlignmentIsTheLargestPowerOfTwoUpTo256) {
  EXPECT_EQ(alignment_of(0), 256);
  EXPECT_EQ(alignment_of(4096), 256);
  EXPECT_EQ(alignment_of(4096 + 128), 128);
  EXPECT_EQ(alignment_of(4096 + 2), 2);
  EXPECT_EQ(alignment_of(4097), 1);
}

}  // namespace
}  // namespace ddp::kernels::lt_plan
