// The transformer ops (GELU, LayerNorm, embedding, softmax / log-softmax, bmm,
// cross-entropy over a vocabulary, causal softmax and attention): values
// against closed forms and hand-computed cases, gradients against central finite
// differences (tests/unit/gradcheck.h), and their error messages.
#include "runtime/ops/transformer_ops.h"
#include "ddp/config.h"
#include "runtime/autograd/autocast.h"
#include "runtime/autograd/functions.h"
#include "runtime/nn/layers.h"
#include "runtime/ops/kernels.h"
#include "runtime/ops/ops.h"
#include "tests/unit/error_text.h"
#include "tests/unit/gradcheck.h"

#include <gtest/gtest.h>
#include "runtime/fmt.h"

#include <bit>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace ddp {
namespace {

namespace F = functional;
using test_util::gradcheck;

using test_util::value_error;

double gelu_tanh(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

TEST(TransformerOps, GeluMatchesTheTanhFormula) {
  const std::vector<float> xs = {-10.0f, -3.0f, -1.0f, -0.5f, 0.0f, 0.5f, 1.0f, 2.0f, 10.0f};
  const auto y = gelu(from_vector(xs, {3, 3})).to_vector<float>();
  for (size_t i = 0; i < xs.size(); ++i) {
    EXPECT_NEAR(y[i], gelu_tanh(xs[i]), 1e-6 * (1.0 + std::fabs(xs[i]))) << "x = " << xs[i];
  }
  // torch.nn.functional.gelu(torch.tensor(1.), approximate='tanh') = 0.8411920070648193.
  EXPECT_NEAR(y[6], 0.841192007f, 1e-6);
  EXPECT_EQ(y[4], 0.0f);
}

// Note [gelu tanh]: the vectorized tanh against double over a dense sweep, both ways
// (forward and the derivative), plus the values where its pieces change (0, the
// exp clamp at |u| ~ 43, huge and non-finite inputs).
TEST(TransformerOps, GeluStaysWithinFloatErrorOfDoubleEverywhere) {
  std::vector<float> xs;
  for (float x = -12.0f; x <= 12.0f; x += 1.0f / 512) xs.push_back(x);
  for (float x : {1e-30f, -1e-30f, 1e-6f, -1e-6f, 30.0f, -30.0f, 45.0f, 1e4f, -1e4f})
    xs.push_back(x);
  const auto n = static_cast<int64_t>(xs.size());
  const Tensor x = from_vector(xs, {n});
  const auto y = gelu(x).to_vector<float>();
  const auto dy = gelu_backward(ones({n}), x).to_vector<float>();
  double worst = 0, worst_grad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double v = xs[i], k = std::sqrt(2.0 / M_PI);
    const double t = std::tanh(k * (v + 0.044715 * v * v * v));
    const double ref = 0.5 * v * (1 + t);
    const double ref_grad = 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * k * (1 + 3 * 0.044715 * v * v);
    worst = std::max(worst, std::fabs(y[i] - ref) / std::max(1.0, std::fabs(v)));
    worst_grad = std::max(worst_grad, std::fabs(dy[i] - ref_grad));
  }
  EXPECT_LT(worst, 5e-7) << worst;
  EXPECT_LT(worst_grad, 1e-6) << worst_grad;
  const auto special =
      gelu(from_vector<float>({std::numeric_limits<float>::infinity(), std::nanf("")}, {2}))
          .to_vector<float>();
  EXPECT_EQ(special[0], std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(special[1]));
}

TEST(TransformerOps, GeluGradientMatchesFiniteDifferences) {
  gradcheck([](auto& in) { return F::gelu(in[0]); }, {scale(randn({4, 7}, 40), 2.0f)}, 1e-2, 2e-3);
}

// Hand-computed: row [1, 2, 3, 4] has mean 2.5 and biased variance 1.25, so
// xhat = [-1.5, -0.5, 0.5, 1.5] / sqrt(1.25 + 1e-5); row [-2, 0, 0, 2] has mean 0 and
// variance 2, xhat = [-2, 0, 0, 2] / sqrt(2 + 1e-5). Then y = xhat * weight + bias.
TEST(TransformerOps, LayerNormMatchesAHandComputedCase) {
  const Tensor x = from_vector<float>({1, 2, 3, 4, -2, 0, 0, 2}, {2, 4});
  const Tensor w = from_vector<float>({1, -1, 2, 0.5f}, {4});
  const Tensor b = from_vector<float>({0, 0.5f, -1, 0.25f}, {4});
  const auto r = layer_norm(x, w, b);
  const std::vector<double> expected = {-1.34163542, 0.94721181, -0.10557639, 0.92081771,
                                        -1.41421003, 0.5,        -1.0,        0.95710501};
  const auto y = r.out.to_vector<float>();
  for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], expected[i], 1e-6) << "element " << i;
  EXPECT_FLOAT_EQ(r.mean.to_vector<float>()[0], 2.5f);
  EXPECT_FLOAT_EQ(r.rstd.to_vector<float>()[1], static_cast<float>(1.0 / std::sqrt(2.00001)));
}

void expect_same_bits(const Tensor& got, const Tensor& want, const std::string& what);

// Note [row sums in lanes]: at every width around the 8 lanes (the lanes alone, the
// tail alone, both) and at GPT-2's, the CPU kernels' mean, rstd, output and
// gradients against long double, from rows centred far from 0 (where a one-pass
// variance would lose digits), and the same bits run to run.
TEST(TransformerOps, LayerNormMatchesLongDoubleAtEveryWidth) {
  for (const int64_t d : {1, 2, 7, 8, 9, 15, 16, 17, 23, 64, 768, 1023}) {
    SCOPED_TRACE(fmt::format("d {}", d));
    const int64_t rows = 3;
    const Tensor x = add(randn({rows, d}, 70 + static_cast<uint64_t>(d)), full({rows, d}, 40.0f));
    const Tensor w = randn({d}, 71), b = randn({d}, 72), g = randn({rows, d}, 73);
    const LayerNormResult r = layer_norm(x, w, b);
    const LayerNormGrads grads = layer_norm_backward(g, x, r, w);
    const auto xs = x.to_vector<float>(), ws = w.to_vector<float>(), bs = b.to_vector<float>();
    const auto gs = g.to_vector<float>(), out = r.out.to_vector<float>();
    const auto mean = r.mean.to_vector<float>(), rstd = r.rstd.to_vector<float>();
    const auto gx = grads.x.to_vector<float>(), gw = grads.weight.to_vector<float>();
    std::vector<long double> want_gw(static_cast<size_t>(d), 0.0L);
    for (int64_t row = 0; row < rows; ++row) {
      const auto at = [&](const std::vector<float>& v, int64_t j) {
        return static_cast<long double>(v[static_cast<size_t>(row * d + j)]);
      };
      long double mu = 0, var = 0;
      for (int64_t j = 0; j < d; ++j) mu += at(xs, j);
      mu /= static_cast<long double>(d);
      for (int64_t j = 0; j < d; ++j) var += (at(xs, j) - mu) * (at(xs, j) - mu);
      var /= static_cast<long double>(d);
      const long double inv = 1.0L / std::sqrt(var + 1e-5L);
      EXPECT_NEAR(mean[static_cast<size_t>(row)], static_cast<double>(mu),
                  1e-6 * std::fabs(static_cast<double>(mu)));
      EXPECT_NEAR(rstd[static_cast<size_t>(row)], static_cast<double>(inv),
                  1e-5 * static_cast<double>(inv));
      // The backward from the forward's saved f32 statistics (as PyTorch's): its own
      // sums against long double, not the statistics' rounding again.
      const long double saved_mu = mean[static_cast<size_t>(row)];
      const long double saved_inv = rstd[static_cast<size_t>(row)];
      long double mean_dxhat = 0, mean_dxhat_xhat = 0;
      for (int64_t j = 0; j < d; ++j) {
        // The output from the saved statistics too (they are checked above): a few
        // float roundings of a value of order 1.
        const long double xhat = (at(xs, j) - saved_mu) * saved_inv;
        const long double want = xhat * ws[static_cast<size_t>(j)] + bs[static_cast<size_t>(j)];
        EXPECT_NEAR(out[static_cast<size_t>(row * d + j)], static_cast<double>(want),
                    1e-5 * (1 + std::fabs(static_cast<double>(want))))
            << "out[" << row << ", " << j << "]";
        const long double dxhat = at(gs, j) * ws[static_cast<size_t>(j)];
        mean_dxhat += dxhat;
        mean_dxhat_xhat += dxhat * xhat;
        want_gw[static_cast<size_t>(j)] += at(gs, j) * xhat;
      }
      mean_dxhat /= static_cast<long double>(d);
      mean_dxhat_xhat /= static_cast<long double>(d);
      for (int64_t j = 0; j < d; ++j) {
        const long double xhat = (at(xs, j) - saved_mu) * saved_inv;
        const long double want = saved_inv * (at(gs, j) * ws[static_cast<size_t>(j)] - mean_dxhat -
                                              xhat * mean_dxhat_xhat);
        EXPECT_NEAR(gx[static_cast<size_t>(row * d + j)], static_cast<double>(want),
                    1e-5 * static_cast<double>(saved_inv))
            << "grad x[" << row << ", " << j << "]";
      }
    }
    for (int64_t j = 0; j < d; ++j) {
      EXPECT_NEAR(gw[static_cast<size_t>(j)], static_cast<double>(want_gw[static_cast<size_t>(j)]),
                  1e-4)
          << "grad weight[" << j << "]";
    }
    const LayerNormResult again = layer_norm(x, w, b);
    expect_same_bits(again.out, r.out, "out, run twice");
    expect_same_bits(again.rstd, r.rstd, "rstd, run twice");
    expect_same_bits(layer_norm_backward(g, x, again, w).x, grads.x, "grad x, run twice");
  }
}

TEST(TransformerOps, LayerNormGradientsMatchFiniteDifferences) {
  gradcheck([](auto& in) { return F::layer_norm(in[0], in[1], in[2]); },
            {randn({2, 3, 6}, 42), randn({6}, 43), randn({6}, 44)}, 1e-2, 3e-3);
  // Rows of 19: two 8-wide lanes and a tail (Note [row sums in lanes]); 6 is a tail only.
  gradcheck([](auto& in) { return F::layer_norm(in[0], in[1], in[2]); },
            {randn({3, 19}, 45), randn({19}, 46), randn({19}, 47)}, 1e-2, 3e-3);
}

TEST(TransformerOps, LayerNormRejectsParametersOfTheWrongSize) {
  const std::string msg = value_error([] { layer_norm(randn({2, 4}, 1), ones({3}), zeros({4})); });
  EXPECT_NE(msg.find("weight has shape [3], expected [4]"), std::string::npos) << msg;
}

// Note [residual layer norm]: the fused op gives the bits of add then layer_norm.
void expect_same_bits(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const Tensor a = cast(got, DType::f32), b = cast(want, DType::f32);
  const auto x = a.to_vector<float>(), y = b.to_vector<float>();
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(x[i]), std::bit_cast<uint32_t>(y[i]))
        << what << " element " << i << ": " << x[i] << " vs " << y[i];
  }
}

// Note [accumulating into a pending gradient]: a gradient to add into gets x's
// gradient added in place, with the bits of the gradient then add; it is returned as
// .x, and a bad one is named.
TEST(TransformerOps, LayerNormBackwardAddsIntoAGivenGradientWithTheBitsOfAnAdd) {
  for (const int64_t d : {1, 7, 8, 33, 768}) {
    SCOPED_TRACE(fmt::format("d = {}", d));
    const Tensor x = randn({5, d}, 1), w = randn({d}, 2), b = randn({d}, 3);
    const Tensor g = randn({5, d}, 4), waiting = randn({5, d}, 5);
    const LayerNormResult r = layer_norm(x, w, b);
    const LayerNormGrads plain = layer_norm_backward(g, x, r, w);
    const Tensor want = add(waiting, plain.x);
    Tensor into = waiting.clone();
    const LayerNormGrads got = layer_norm_backward(g, x, r, w, into);
    EXPECT_EQ(got.x.data_ptr(), into.data_ptr()) << "added in place";
    expect_same_bits(got.x, want, "grad x + waiting");
    expect_same_bits(got.weight, plain.weight, "grad weight");
    expect_same_bits(got.bias, plain.bias, "grad bias");
    // A bf16 gradient (autocast's) is widened first: the same bits again.
    const Tensor g16 = cast(g, DType::bf16);
    Tensor into16 = waiting.clone();
    expect_same_bits(layer_norm_backward(g16, x, r, w, into16).x,
                     add(waiting, layer_norm_backward(g16, x, r, w).x), "bf16 grad");
  }
  const Tensor x = randn({2, 4}, 1), w = ones({4});
  const LayerNormResult r = layer_norm(x, w, zeros({4}));
  const Tensor g = randn({2, 4}, 9);
  const std::string alias = value_error([&] { layer_norm_backward(g, x, r, w, g); });
  EXPECT_NE(alias.find("the gradient to add into shares memory with grad"), std::string::npos)
      << alias;
  for (const Tensor& bad : {cast(randn({2, 4}, 6), DType::bf16), randn({2, 5}, 7)}) {
    const std::string msg = value_error([&] {
      layer_norm_backward(randn({2, 4}, 8), x, r, w, bad);
    });
    EXPECT_NE(msg.find("layer_norm_backward: the gradient to add into is"), std::string::npos)
        << msg;
    EXPECT_NE(msg.find("expected f32 [2, 4] (x's)"), std::string::npos) << msg;
  }
}

TEST(TransformerOps, AddLayerNormGivesTheBitsOfAddThenLayerNorm) {
  const Tensor x = scale(randn({3, 5, 37}, 51), 3.0f), w = randn({37}, 52), b = randn({37}, 53);
  for (DType y_dtype : {DType::f32, DType::bf16}) {
    for (DType out_dtype : {DType::f32, DType::bf16}) {
      const std::string what =
          fmt::format("y {}, out {}", dtype_name(y_dtype), dtype_name(out_dtype));
      const Tensor y = cast(randn({3, 5, 37}, 54), y_dtype);
      const auto fused = add_layer_norm(x, y, w, b, 1e-5f, out_dtype);
      const Tensor sum = add(x, y);
      const auto apart = layer_norm(sum, w, b, 1e-5f, out_dtype);
      expect_same_bits(fused.sum, sum, what + ": sum");
      expect_same_bits(fused.norm.out, apart.out, what + ": out");
      expect_same_bits(fused.norm.mean, apart.mean, what + ": mean");
      expect_same_bits(fused.norm.rstd, apart.rstd, what + ": rstd");
    }
  }
  // A 16-bit x is not fused (the sum would be 16-bit): the two ops, the same bits.
  const Tensor xh = cast(x, DType::bf16), yh = cast(randn({3, 5, 37}, 55), DType::bf16);
  const auto r = add_layer_norm(xh, yh, w, b);
  expect_same_bits(r.sum, add(xh, yh), "bf16 x: sum");
  expect_same_bits(r.norm.out, layer_norm(add(xh, yh), w, b).out, "bf16 x: out");
}

// Both outputs feed the loss, as in a block (h goes on down the residual stream,
// ln_2(h) into the MLP): every gradient equals the two ops' bit for bit.
TEST(TransformerOps, AddLayerNormGradientsAreTheTwoOpsGradients) {
  const Tensor p_sum = randn({4, 24}, 61), p_out = randn({4, 24}, 62);
  const auto run = [&](bool fused) {
    std::vector<Tensor> in{randn({4, 24}, 63), randn({4, 24}, 64), randn({24}, 65),
                           randn({24}, 66)};
    for (Tensor& t : in) set_requires_grad(t, true);
    Tensor sum, out;
    if (fused) {
      std::tie(sum, out) = [&] {
        auto r = F::add_layer_norm(in[0], in[1], in[2], in[3]);
        return std::pair{r.sum, r.out};
      }();
    } else {
      sum = F::add(in[0], in[1]);
      out = F::layer_norm(sum, in[2], in[3]);
    }
    backward(F::add(F::sum(F::mul(sum, p_sum)), F::sum(F::mul(out, p_out))));
    std::vector<Tensor> grads;
    for (const Tensor& t : in) grads.push_back(grad(t));
    return grads;
  };
  const auto fused = run(true), apart = run(false);
  const char* names[] = {"x", "y", "weight", "bias"};
  for (size_t i = 0; i < fused.size(); ++i) expect_same_bits(fused[i], apart[i], names[i]);
}

TEST(TransformerOps, AddLayerNormGradientsMatchFiniteDifferences) {
  gradcheck(
      [](auto& in) {
        auto r = F::add_layer_norm(in[0], in[1], in[2], in[3]);
        return F::add(r.out, F::scale(r.sum, 0.5f));
      },
      {randn({2, 3, 6}, 71), randn({2, 3, 6}, 72), randn({6}, 73), randn({6}, 74)}, 1e-2, 3e-3);
}

TEST(TransformerOps, AddLayerNormNamesBadInput) {
  std::string msg = value_error([] {
    add_layer_norm(randn({2, 4}, 1), randn({4, 2}, 2), ones({4}), zeros({4}));
  });
  EXPECT_NE(msg.find("add_layer_norm: shapes [2, 4] and [4, 2] must be equal"), std::string::npos)
      << msg;
  msg = value_error([] {
    add_layer_norm(randn({2, 4}, 1), randn({2, 4}, 2), ones({3}), zeros({4}));
  });
  EXPECT_NE(msg.find("add_layer_norm: weight has shape [3], expected [4]"), std::string::npos)
      << msg;
  msg = value_error([] {
    add_layer_norm(randn({2, 4}, 1), randn({2, 4}, 2), ones({4}), zeros({4}), 0.0f);
  });
  EXPECT_NE(msg.find("add_layer_norm: eps must be > 0"), std::string::npos) << msg;
  msg = value_error([] {
    add_layer_norm(randn({2, 4}, 1), randn({2, 4}, 2), ones({4}), zeros({4}), 1e-5f, DType::i64);
  });
  EXPECT_NE(msg.find("add_layer_norm: out_dtype must be f32, bf16 or f16, got i64"),
            std::string::npos)
      << msg;
}

// A LayerNorm with forward hooks (a ZeRO-3 unit) adds first and runs them around the
// norm; without hooks it fuses. Both give the two ops' values.
TEST(TransformerOps, LayerNormForwardAddRunsTheModulesHooks) {
  nn::LayerNorm norm(8);
  copy_(norm.weight, randn({8}, 81));
  const Tensor x = randn({3, 8}, 82), y = randn({3, 8}, 83);
  const Tensor want = F::layer_norm(F::add(x, y), norm.weight, norm.bias);
  expect_same_bits(norm.forward_add(x, y).out, want, "no hooks");
  int calls = 0;
  norm.add_forward_hooks([&](nn::Module&) { ++calls; }, {});
  const auto r = norm.forward_add(x, y);
  EXPECT_EQ(calls, 1);
  expect_same_bits(r.sum, F::add(x, y), "hooks: sum");
  expect_same_bits(r.out, want, "hooks: out");
}

// F::gelu_mlp records one node for c_proj(gelu(c_fc(x))); off CUDA (or with the
// epilogues off) its kernels are the three ops', so values and gradients are theirs
// bit for bit, in f32 and under autocast.
TEST(TransformerOps, GeluMlpGivesTheThreeOpsValuesAndGradients) {
  for (bool mixed : {false, true}) {
    SCOPED_TRACE(mixed ? "under autocast" : "f32");
    const auto run = [&](bool fused) {
      std::vector<Tensor> in{randn({6, 8}, 91), scale(randn({16, 8}, 92), 0.3f), randn({16}, 93),
                             scale(randn({8, 16}, 94), 0.3f), randn({8}, 95)};
      for (Tensor& t : in) set_requires_grad(t, true);
      Tensor y;
      {
        const AutocastGuard autocast(DType::bf16, mixed);
        y = fused ? F::gelu_mlp(in[0], in[1], in[2], in[3], in[4])
                  : F::linear(F::gelu(F::linear(in[0], in[1], in[2])), in[3], in[4]);
      }
      backward(F::sum(F::mul(F::cast(y, DType::f32), randn({6, 8}, 96))));
      std::vector<Tensor> out{y};
      for (const Tensor& t : in) out.push_back(grad(t));
      return out;
    };
    const auto fused = run(true), apart = run(false);
    const char* names[] = {"y", "x", "fc weight", "fc bias", "proj weight", "proj bias"};
    for (size_t i = 0; i < fused.size(); ++i) expect_same_bits(fused[i], apart[i], names[i]);
  }
}

TEST(TransformerOps, GeluMlpGradientsMatchFiniteDifferences) {
  gradcheck(
      [](auto& in) { return F::gelu_mlp(in[0], in[1], in[2], in[3], in[4]); },
      {randn({3, 4}, 97), randn({8, 4}, 98), randn({8}, 99), randn({5, 8}, 100), randn({5}, 101)},
      1e-2, 3e-3);
}

TEST(TransformerOps, GeluEpilogueOpsNameShapesThatDoNotFit) {
  std::string msg = value_error([] {
    linear_gelu(randn({2, 4}, 1), randn({8, 3}, 2), zeros({8}));
  });
  EXPECT_NE(msg.find("linear_gelu: input [2, 4], weight [8, 3] and bias [8] do not fit"),
            std::string::npos)
      << msg;
  msg = value_error([] {
    linear_input_grad_gelu(randn({2, 5}, 1), randn({5, 8}, 2), randn({2, 7}, 3));
  });
  EXPECT_NE(
      msg.find("linear_input_grad_gelu: grad [2, 5], weight [5, 8] and pre [2, 7] do not fit"),
      std::string::npos)
      << msg;
  EXPECT_FALSE(gelu_epilogues_enabled() && !DDP_HAVE_CUDA);
}

TEST(TransformerOps, EmbeddingPicksRowsAndRepeatedIndicesAccumulate) {
  const Tensor weight = randn({5, 3}, 45);
  const Tensor indices = from_vector<int64_t>({1, 3, 1, 0}, {2, 2});
  const Tensor out = embedding(weight, indices);
  ASSERT_EQ(out.shape(), (Shape{2, 2, 3}));
  const auto w = weight.to_vector<float>(), o = out.to_vector<float>();
  const int64_t picked[4] = {1, 3, 1, 0};
  for (size_t i = 0; i < 4; ++i) {
    for (size_t j = 0; j < 3; ++j) EXPECT_EQ(o[i * 3 + j], w[picked[i] * 3 + j]);
  }
  // Row 1 is read twice, so its gradient is the sum of both output rows' gradients.
  const Tensor g = from_vector<float>({1, 2, 3, 10, 20, 30, 100, 200, 300, -1, -2, -3}, {2, 2, 3});
  const auto gw = embedding_backward(g, indices, 5).to_vector<float>();
  const std::vector<float> expected = {-1, -2, -3, 101, 202, 303, 0, 0, 0, 10, 20, 30, 0, 0, 0};
  EXPECT_EQ(gw, expected);
}

TEST(TransformerOps, EmbeddingWeightGradientMatchesFiniteDifferences) {
  const Tensor indices = from_vector<int64_t>({4, 0, 2, 4, 4, 1}, {3, 2});
  gradcheck([indices](auto& in) { return F::embedding(in[0], indices); }, {randn({6, 4}, 46)}, 1e-2,
            2e-3);
}

TEST(TransformerOps, EmbeddingIndexOutOfRangeNamesTheIndexAndTheTableSize) {
  const Tensor weight = randn({5, 2}, 47);
  std::string msg = value_error([&] { embedding(weight, from_vector<int64_t>({0, 7, 1}, {3})); });
  EXPECT_NE(msg.find("index 7 at position 1 is outside the table of 5 rows"), std::string::npos)
      << msg;
  msg = value_error([&] { embedding(weight, from_vector<int64_t>({-1}, {1})); });
  EXPECT_NE(msg.find("index -1"), std::string::npos) << msg;
  msg = value_error([&] { embedding(weight, from_vector<float>({0}, {1})); });
  EXPECT_NE(msg.find("indices must have dtype i64"), std::string::npos) << msg;
}

// Row r of x [rows, d] against softmax and log-softmax computed in double.
void expect_softmax_rows(const Tensor& x, const Tensor& y, const Tensor& log_y) {
  const int64_t d = x.size(-1), rows = x.numel() / d;
  const auto v = x.to_vector<float>(), p = y.to_vector<float>(), lp = log_y.to_vector<float>();
  for (int64_t r = 0; r < rows; ++r) {
    double max = v[r * d];
    for (int64_t j = 1; j < d; ++j) max = std::max<double>(max, v[r * d + j]);
    double sum = 0.0;
    for (int64_t j = 0; j < d; ++j) sum += std::exp(v[r * d + j] - max);
    for (int64_t j = 0; j < d; ++j) {
      const size_t i = static_cast<size_t>(r * d + j);
      ASSERT_TRUE(std::isfinite(p[i]) && std::isfinite(lp[i])) << "element " << i;
      EXPECT_NEAR(p[i], std::exp(v[i] - max) / sum, 1e-6) << "element " << i;
      EXPECT_NEAR(lp[i], v[i] - max - std::log(sum), 1e-5 * (1.0 + std::fabs(v[i] - max)))
          << "element " << i;
    }
  }
}

TEST(TransformerOps, SoftmaxAndLogSoftmaxAlongTheLastDim) {
  const Tensor x = scale(randn({2, 3, 5}, 48), 3.0f);
  expect_softmax_rows(x, softmax(x), log_softmax(x));
}

// exp(1e4) overflows f32 (and double): only the max-subtracted form stays finite.
TEST(TransformerOps, SoftmaxOfLargeLogitsStaysFinite) {
  const Tensor x = from_vector<float>({1e4f, 1e4f - 1.0f, -1e4f, 0.0f, -1e4f, -1e4f}, {2, 3});
  const Tensor y = softmax(x), log_y = log_softmax(x);
  expect_softmax_rows(x, y, log_y);
  const Tensor g = randn({2, 3}, 49);
  for (const Tensor& grad : {softmax_backward(g, y), log_softmax_backward(g, log_y)}) {
    for (float v : grad.to_vector<float>()) EXPECT_TRUE(std::isfinite(v)) << v;
  }
}

TEST(TransformerOps, SoftmaxGradientsMatchFiniteDifferences) {
  gradcheck([](auto& in) { return F::softmax(in[0]); }, {randn({3, 2, 5}, 50)}, 1e-2, 2e-3);
  gradcheck([](auto& in) { return F::log_softmax(in[0]); }, {randn({3, 2, 5}, 51)}, 1e-2, 2e-3);
}

// Softmax is shift-invariant, so logits near 1e4 (exactly representable shifts of
// small ones) must give the small logits' gradients: finite differences at 1e4
// would only measure f32 rounding (its spacing there is 1e-3).
TEST(TransformerOps, SoftmaxGradientOfLargeLogitsEqualsTheShiftedOnes) {
  std::vector<float> small = {0.0f, -1.0f, -2.5f, 0.5f, 3.0f, -0.25f};
  std::vector<float> large = small;
  for (float& v : large) v += 1e4f;
  const Tensor g = randn({2, 3}, 52);
  for (bool log : {false, true}) {
    std::vector<std::vector<float>> grads;
    for (const auto* values : {&small, &large}) {
      Tensor x = from_vector(*values, {2, 3});
      set_requires_grad(x, true);
      backward(F::sum(F::mul(log ? F::log_softmax(x) : F::softmax(x), g)));
      grads.push_back(grad(x).to_vector<float>());
    }
    for (size_t i = 0; i < small.size(); ++i) {
      EXPECT_NEAR(grads[1][i], grads[0][i], 1e-5) << (log ? "log_softmax" : "softmax") << " " << i;
    }
  }
}

// A backward that saved its own output would keep the output alive through its
// node (output -> node -> output): a graph never backwarded would leak.
TEST(TransformerOps, OutputsAreFreedWithoutABackward) {
  const std::vector<std::function<Tensor(const Tensor&)>> ops = {
      [](const Tensor& x) { return F::softmax(x); },
      [](const Tensor& x) { return F::log_softmax(x); },
      [](const Tensor& x) { return F::layer_norm(x, ones({4}), zeros({4})); },
      [](const Tensor& x) { return F::gelu(x); }};
  for (size_t k = 0; k < ops.size(); ++k) {
    std::weak_ptr<TensorImpl> out;
    {
      Tensor x = randn({3, 4}, 53);
      set_requires_grad(x, true);
      out = ops[k](x).impl_ptr();
    }
    EXPECT_TRUE(out.expired()) << "op " << k;
  }
}

// out[i] = alpha op(a[i]) op(b[i]) computed in double from the flat values.
std::vector<double> naive_bmm(const Tensor& a, const Tensor& b, const BmmOptions& o) {
  const auto av = a.to_vector<float>(), bv = b.to_vector<float>();
  const int64_t batch = a.size(0), ar = a.size(1), ac = a.size(2), br = b.size(1), bc = b.size(2);
  const int64_t m = o.trans_a ? ac : ar, k = o.trans_a ? ar : ac, n = o.trans_b ? br : bc;
  std::vector<double> out(static_cast<size_t>(batch * m * n), 0.0);
  for (int64_t i = 0; i < batch; ++i) {
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t c = 0; c < n; ++c) {
        double acc = 0.0;
        for (int64_t j = 0; j < k; ++j) {
          const float x = av[i * ar * ac + (o.trans_a ? j * ac + r : r * ac + j)];
          const float y = bv[i * br * bc + (o.trans_b ? c * bc + j : j * bc + c)];
          acc += static_cast<double>(x) * y;
        }
        out[i * m * n + r * n + c] = o.alpha * acc;
      }
    }
  }
  return out;
}

// a [B, M, K] and b [B, K, N] stored transposed where the flags say so.
std::vector<Tensor> bmm_inputs(const BmmOptions& o, uint64_t seed) {
  const int64_t batch = 3, m = 4, k = 5, n = 2;
  return {randn(o.trans_a ? Shape{batch, k, m} : Shape{batch, m, k}, seed),
          randn(o.trans_b ? Shape{batch, n, k} : Shape{batch, k, n}, seed + 1)};
}

const BmmOptions kBmmCases[] = {
    {false, false, 1.0f}, {false, true, 0.5f}, {true, false, -2.0f}, {true, true, 1.0f}};

TEST(TransformerOps, BmmMatchesANaiveProductForEveryTransposeCombination) {
  for (const BmmOptions& o : kBmmCases) {
    const auto in = bmm_inputs(o, 60);
    const Tensor out = bmm(in[0], in[1], o);
    ASSERT_EQ(out.shape(), (Shape{3, 4, 2}));
    const auto got = out.to_vector<float>();
    const auto want = naive_bmm(in[0], in[1], o);
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_NEAR(got[i], want[i], 1e-5 * (1.0 + std::fabs(want[i])))
          << "trans_a " << o.trans_a << " trans_b " << o.trans_b << " element " << i;
    }
  }
}

TEST(TransformerOps, BmmGradientsMatchFiniteDifferences) {
  for (const BmmOptions& o : kBmmCases) {
    SCOPED_TRACE(testing::Message() << "trans_a " << o.trans_a << " trans_b " << o.trans_b);
    gradcheck([o](auto& in) { return F::bmm(in[0], in[1], o); }, bmm_inputs(o, 61), 1e-2, 2e-3);
  }
}

TEST(TransformerOps, BmmShapeMismatchNamesBothShapes) {
  std::string msg = value_error([] { bmm(randn({2, 3, 4}, 1), randn({2, 5, 6}, 2)); });
  EXPECT_NE(msg.find("a [2, 3, 4] and b [2, 5, 6] do not multiply"), std::string::npos) << msg;
  EXPECT_NE(msg.find("columns (4) equal to b's rows (5)"), std::string::npos) << msg;
  msg = value_error([] { bmm(randn({2, 3, 4}, 1), randn({3, 4, 6}, 2)); });
  EXPECT_NE(msg.find("a [2, 3, 4] and b [3, 4, 6]"), std::string::npos) << msg;
  msg = value_error([] { bmm(randn({3, 4}, 1), randn({4, 6}, 2)); });
  EXPECT_NE(msg.find("expects 3-D batches [B, M, K] and [B, K, N], got a [3, 4] and b [4, 6]"),
            std::string::npos)
      << msg;
}

// Uniform logits give every class probability 1 / V: the loss is log V whatever the
// targets, and the gradient (softmax - onehot) / N is (1/V - [j == target]) / N.
TEST(TransformerOps, CrossEntropyOfUniformLogitsIsLogV) {
  const int64_t n = 3, v = 50257;  // GPT-2's vocabulary
  Tensor logits = full({n, v}, 7.5);
  set_requires_grad(logits, true);
  const Tensor targets = from_vector<int64_t>({0, 50256, 1234}, {n});
  const Tensor loss = F::cross_entropy(logits, targets);
  EXPECT_NEAR(loss.item<float>(), std::log(static_cast<double>(v)), 1e-5);
  backward(loss);
  const auto g = grad(logits).to_vector<float>();
  const int64_t picked[3] = {0, 50256, 1234};
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t j : {int64_t{0}, int64_t{1}, int64_t{1234}, int64_t{50256}}) {
      const double want = (1.0 / v - (j == picked[r] ? 1.0 : 0.0)) / n;
      EXPECT_NEAR(g[r * v + j], want, 1e-7) << "row " << r << " class " << j;
    }
  }
}

TEST(TransformerOps, CrossEntropyMatchesPyTorch) {
  // /usr/bin/python3 -c "import torch; x = torch.tensor([[1.,-2.,.5,3.],[0.,.25,-1.5,2.],
  //   [10.,10.,-10.,0.]], requires_grad=True); l = torch.nn.functional.cross_entropy(x,
  //   torch.tensor([3,0,2])); l.backward(); print(l.item(), x.grad.flatten().tolist())"
  // (PyTorch 1.13.)
  Tensor logits = from_vector<float>({1, -2, 0.5f, 3, 0, 0.25f, -1.5f, 2, 10, 10, -10, 0}, {3, 4});
  set_requires_grad(logits, true);
  const Tensor loss = F::cross_entropy(logits, from_vector<int64_t>({3, 0, 2}, {3}));
  EXPECT_NEAR(loss.item<float>(), 7.72919225692749, 1e-5);
  backward(loss);
  const std::vector<double> torch_grad = {
      0.036851245909929276, 0.001834715949371457, 0.02235141023993492,  -0.06103738397359848,
      -0.2996504008769989,  0.04324973374605179,  0.007515676319599152, 0.24888500571250916,
      0.16666290163993835,  0.16666290163993835,  -0.3333333432674408,  7.566485692223068e-06};
  const auto g = grad(logits).to_vector<float>();
  for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], torch_grad[i], 1e-6) << "element " << i;
}

TEST(TransformerOps, CrossEntropyGradientMatchesFiniteDifferences) {
  const Tensor targets = from_vector<int64_t>({2, 0, 6, 6}, {4});
  gradcheck([targets](auto& in) { return F::reshape(F::cross_entropy(in[0], targets), {1}); },
            {scale(randn({4, 7}, 62), 2.0f)}, 1e-2, 2e-3);
}

TEST(TransformerOps, CrossEntropyTargetOutOfRangeNamesItAndV) {
  const Tensor logits = randn({2, 5}, 63);
  std::string msg = value_error([&] {
    F::cross_entropy(logits, from_vector<int64_t>({1, 5}, {2}));
  });
  EXPECT_NE(msg.find("label 5 of row 1 is out of range for 5 classes (valid: 0 to 4)"),
            std::string::npos)
      << msg;
  msg = value_error([&] { F::cross_entropy(logits, from_vector<int64_t>({-1, 0}, {2})); });
  EXPECT_NE(msg.find("label -1 of row 0"), std::string::npos) << msg;
}

TEST(TransformerOps, CausalSoftmaxMasksTheFutureWithExactZeros) {
  const Tensor x = scale(randn({2, 4, 4}, 64), 3.0f);
  const auto v = x.to_vector<float>(), p = causal_softmax(x).to_vector<float>();
  for (int64_t m = 0; m < 2; ++m) {
    for (int64_t i = 0; i < 4; ++i) {
      const int64_t row = (m * 4 + i) * 4;
      double max = v[row], sum = 0.0;
      for (int64_t j = 1; j <= i; ++j) max = std::max<double>(max, v[row + j]);
      for (int64_t j = 0; j <= i; ++j) sum += std::exp(v[row + j] - max);
      for (int64_t j = 0; j < 4; ++j) {
        const double want = j <= i ? std::exp(v[row + j] - max) / sum : 0.0;
        if (j > i) {
          EXPECT_EQ(p[row + j], 0.0f) << "matrix " << m << " row " << i << " column " << j;
        } else {
          EXPECT_NEAR(p[row + j], want, 1e-6) << "matrix " << m << " row " << i << " column " << j;
        }
      }
    }
  }
  const std::string msg = value_error([] { causal_softmax(randn({2, 3, 4}, 1)); });
  EXPECT_NE(msg.find("square attention scores [..., T, T] with T >= 1, got shape [2, 3, 4]"),
            std::string::npos)
      << msg;
}

TEST(TransformerOps, CausalSoftmaxGradientMatchesFiniteDifferences) {
  gradcheck([](auto& in) { return F::causal_softmax(in[0]); }, {randn({2, 3, 3}, 65)}, 1e-2, 2e-3);
}

// softmax(q k^T / sqrt(D) + mask) v computed in double, q, k, v [B, H, T, D].
std::vector<double> naive_attention(const Tensor& q, const Tensor& k, const Tensor& v) {
  const int64_t bh = q.size(0) * q.size(1), t = q.size(2), d = q.size(3);
  const auto qv = q.to_vector<float>(), kv = k.to_vector<float>(), vv = v.to_vector<float>();
  std::vector<double> out(qv.size(), 0.0);
  for (int64_t h = 0; h < bh; ++h) {
    const int64_t base = h * t * d;
    for (int64_t i = 0; i < t; ++i) {
      std::vector<double> s(static_cast<size_t>(i + 1));
      double max = -1e300, sum = 0.0;
      for (int64_t j = 0; j <= i; ++j) {
        for (int64_t c = 0; c < d; ++c) s[j] += double{qv[base + i * d + c]} * kv[base + j * d + c];
        s[j] /= std::sqrt(static_cast<double>(d));
        max = std::max(max, s[j]);
      }
      for (int64_t j = 0; j <= i; ++j) sum += (s[j] = std::exp(s[j] - max));
      for (int64_t j = 0; j <= i; ++j) {
        for (int64_t c = 0; c < d; ++c) out[base + i * d + c] += s[j] / sum * vv[base + j * d + c];
      }
    }
  }
  return out;
}

TEST(TransformerOps, CausalAttentionMatchesANaiveReference) {
  const Tensor q = randn({2, 2, 5, 3}, 66), k = randn({2, 2, 5, 3}, 67),
               v = randn({2, 2, 5, 3}, 68);
  const Tensor out = F::causal_attention(q, k, v);
  ASSERT_EQ(out.shape(), q.shape());
  const auto got = out.to_vector<float>();
  const auto want = naive_attention(q, k, v);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5) << "element " << i;
  const std::string msg = value_error([&] { F::causal_attention(q, k, randn({2, 2, 4, 3}, 1)); });
  EXPECT_NE(msg.find("got q [2, 2, 5, 3], k [2, 2, 5, 3], v [2, 2, 4, 3]"), std::string::npos)
      << msg;
}

TEST(TransformerOps, CausalAttentionGradientsMatchFiniteDifferences) {
  gradcheck([](auto& in) { return F::causal_attention(in[0], in[1], in[2]); },
            {randn({1, 2, 3, 2}, 69), randn({1, 2, 3, 2}, 70), randn({1, 2, 3, 2}, 71)}, 1e-2,
            2e-3);
}

// Changing q, k and v at positions > i leaves the output at positions <= i bit for
// bit unchanged, and the gradient of output position i reaches no input position > i.
TEST(TransformerOps, CausalAttentionOutputDoesNotDependOnLaterPositions) {
  const int64_t t = 5, d = 3, cut = 2;  // positions 0..cut kept, cut+1.. changed
  std::vector<Tensor> in = {randn({1, 2, t, d}, 72), randn({1, 2, t, d}, 73),
                            randn({1, 2, t, d}, 74)};
  std::vector<Tensor> changed;
  for (size_t n = 0; n < in.size(); ++n) {
    auto values = in[n].to_vector<float>();
    for (size_t i = 0; i < values.size(); ++i) {
      if (static_cast<int64_t>(i) / d % t > cut) values[i] += 10.0f * static_cast<float>(n + 1);
    }
    changed.push_back(from_vector(values, in[n].shape()));
  }
  const auto a = F::causal_attention(in[0], in[1], in[2]).to_vector<float>();
  const auto b = F::causal_attention(changed[0], changed[1], changed[2]).to_vector<float>();
  int64_t differ_later = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (static_cast<int64_t>(i) / d % t <= cut) {
      EXPECT_EQ(a[i], b[i]) << "element " << i << " at position " << i / d % t;
    } else {
      differ_later += a[i] != b[i];
    }
  }
  EXPECT_GT(differ_later, 0) << "the change at later positions must reach later outputs";

  for (Tensor& x : in) set_requires_grad(x, true);
  const Tensor out = F::causal_attention(in[0], in[1], in[2]);
  std::vector<float> pick(static_cast<size_t>(out.numel()), 0.0f);
  for (size_t i = 0; i < pick.size(); ++i)
    pick[i] = static_cast<int64_t>(i) / d % t == cut ? 1.0f : 0.0f;
  backward(F::sum(F::mul(out, from_vector(pick, out.shape()))));
  for (size_t n = 0; n < in.size(); ++n) {
    const auto g = grad(in[n]).to_vector<float>();
    for (size_t i = 0; i < g.size(); ++i) {
      if (static_cast<int64_t>(i) / d % t > cut) {
        EXPECT_EQ(g[i], 0.0f) << "input " << n << " element " << i;
      }
    }
  }
}

// The CUDA kernels run only where a GPU is (tests/gpu/transformer_ops_gpu_test.cpp
// compares each with these CPU kernels). A build without CUDA links stubs instead:
// a cuda tensor cannot exist there, but if an entry is reached it must name the op
// and the fix rather than return garbage. Call them directly, as the ops would.
#if !DDP_HAVE_CUDA && !DDP_CUDA_EMULATION
void expect_no_cuda_build_message(const std::string& op, const std::function<void()>& call) {
  try {
    call();
    FAIL() << "kernels::cuda::" << op << " did not throw";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find(op + ": this build of ddp has no CUDA support"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("-DDDP_CUDA=ON"), std::string::npos) << e.what();
  }
}
#endif

TEST(TransformerOps, CudaEntriesOfABuildWithoutCudaNameTheOpAndTheFix) {
#if DDP_HAVE_CUDA || DDP_CUDA_EMULATION
  GTEST_SKIP() << "this build has the CUDA kernels (compiled, or emulated on the CPU), not the "
                  "stubs: the gpu tests (tests/gpu/transformer_ops_gpu_test.cpp) check them";
#else
  const Tensor x = randn({2}, 41);
  Tensor out = empty({2});
  expect_no_cuda_build_message("gelu", [&] { kernels::cuda::gelu(x, out); });
  const Tensor m = randn({1, 2, 2}, 42);
  Tensor mout = empty({1, 2, 2});
  expect_no_cuda_build_message("bmm", [&] { kernels::cuda::bmm(m, m, mout, false, false, 1.0f); });
  expect_no_cuda_build_message("causal_softmax", [&] { kernels::cuda::causal_softmax(m, mout); });
  const Tensor qkv = randn({1, 2, 6}, 43);
  Tensor y = empty({1, 2, 2}), probs = empty({1, 1, 2, 2});
  expect_no_cuda_build_message("attention_forward",
                               [&] { kernels::cuda::attention_forward(qkv, 1, y, probs); });
  Tensor total = empty({});
  expect_no_cuda_build_message("sum_squares", [&] { kernels::cuda::sum_squares(x, total); });
  Tensor sum = empty({2}), mean = empty({1}), rstd = empty({1});
  expect_no_cuda_build_message("residual_layer_norm", [&] {
    kernels::cuda::residual_layer_norm(x, x, x, x, 1e-5f, sum, out, mean, rstd);
  });
#endif
}

}  // namespace
}  // namespace ddp
