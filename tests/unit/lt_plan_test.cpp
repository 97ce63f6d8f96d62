// The host side of the cuBLASLt linear layer (runtime/ops/cuda/lt_plan.h, Note
// [cublasLt linear]) replayed on the CPU: a column-major reference matmul with
// cuBLASLt's semantics (op(A) [m, k] op(B) [k, n] + bias[row]) reads the operands
// through the plan's layouts, checks the leading dimensions cuBLASLt would reject and
// that every element it touches lies inside its tensor, and must reproduce the CPU's
// row-major matmul and linear ops. Only cuBLASLt itself is left to the gpu tests.
#include "runtime/ops/cuda/lt_plan.h"

#include "runtime/ops/ops.h"
#include "runtime/tensor.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

namespace ddp::kernels::lt_plan {
namespace {

// D = op(A) op(B) (+ bias per row of D), column-major, in double; A is cuBLASLt's
// first operand (our second), B its second (our first). With a BGRADB epilogue,
// *bias_grad gets the sums of op(B) over k, one per column of D.
std::vector<float> replay(const Plan& p, const std::vector<float>& a, const std::vector<float>& b,
                          const std::vector<float>& bias, std::vector<float>* bias_grad = nullptr) {
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
