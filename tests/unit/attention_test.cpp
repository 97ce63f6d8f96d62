// The packed causal self-attention (Note [packed attention] in ops/transformer_ops.h):
// equal to functional::causal_attention on the heads split out of qkv, gradients against
// central finite differences, causality of outputs and gradients, and the shape messages.
#include "runtime/autograd/functions.h"
#include "runtime/ops/transformer_ops.h"
#include "tests/unit/error_text.h"
#include "tests/unit/gradcheck.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace ddp {
namespace {

namespace F = functional;
using test_util::gradcheck;

using test_util::value_error;

// qkv [B, T, 3C] -> part (0 q, 1 k, 2 v) as [B, H, T, D], the permute nanoGPT does.
Tensor split_head(const Tensor& qkv, int64_t heads, int64_t part) {
  const int64_t b = qkv.size(0), t = qkv.size(1), c = qkv.size(2) / 3, d = c / heads;
  const auto src = qkv.to_vector<float>();
  std::vector<float> out(static_cast<size_t>(b * t * c));
  for (int64_t n = 0; n < b; ++n)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < t; ++i)
        for (int64_t j = 0; j < d; ++j)
          out[static_cast<size_t>(((n * heads + h) * t + i) * d + j)] =
              src[static_cast<size_t>((n * t + i) * 3 * c + part * c + h * d + j)];
  return from_vector(out, {b, heads, t, d});
}

// y [B, H, T, D] -> [B, T, C] with head h at columns h*D.. (nanoGPT's transpose + view).
std::vector<float> merge_heads(const Tensor& y) {
  const int64_t b = y.size(0), heads = y.size(1), t = y.size(2), d = y.size(3);
  const auto src = y.to_vector<float>();
  std::vector<float> out(src.size());
  for (int64_t n = 0; n < b; ++n)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < t; ++i)
        for (int64_t j = 0; j < d; ++j)
          out[static_cast<size_t>((n * t + i) * heads * d + h * d + j)] =
              src[static_cast<size_t>(((n * heads + h) * t + i) * d + j)];
  return out;
}

TEST(Attention, PackedEqualsTheComposedAttentionOnTheSplitHeads) {
  const int64_t heads = 3;
  const Tensor qkv = randn({2, 7, 3 * 12}, 81);
  const Tensor y = F::causal_self_attention(qkv, heads);
  ASSERT_EQ(y.shape(), Shape({2, 7, 12}));
  const auto want = merge_heads(F::causal_attention(
      split_head(qkv, heads, 0), split_head(qkv, heads, 1), split_head(qkv, heads, 2)));
  const auto got = y.to_vector<float>();
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5) << "element " << i;
}

TEST(Attention, ProbsAreTheCausalSoftmaxWithExactZerosAboveTheDiagonal) {
  const Tensor qkv = randn({1, 4, 3 * 4}, 82);
  const auto r = causal_self_attention(qkv, 2);
  ASSERT_EQ(r.probs.shape(), Shape({1, 2, 4, 4}));
  const auto p = r.probs.to_vector<float>();
  for (int64_t m = 0; m < 2; ++m) {
    for (int64_t i = 0; i < 4; ++i) {
      double row = 0;
      for (int64_t j = 0; j < 4; ++j) {
        const float v = p[static_cast<size_t>((m * 4 + i) * 4 + j)];
        if (j > i) {
          EXPECT_EQ(v, 0.0f) << "head " << m << " row " << i << " column " << j;
        }
        row += v;
      }
      EXPECT_NEAR(row, 1.0, 1e-6) << "head " << m << " row " << i;
    }
  }
}

TEST(Attention, GradientMatchesTheComposedAttention) {
  const int64_t heads = 2;
  Tensor qkv = randn({2, 5, 3 * 6}, 83);
  set_requires_grad(qkv, true);
  const Tensor projection = randn({2, 5, 6}, 84);
  backward(F::sum(F::mul(F::causal_self_attention(qkv, heads), projection)));
  const auto packed = grad(qkv).to_vector<float>();

  std::vector<Tensor> parts;
  for (int64_t part = 0; part < 3; ++part) {
    parts.push_back(split_head(qkv, heads, part));
    set_requires_grad(parts.back(), true);
  }
  const Tensor y = F::causal_attention(parts[0], parts[1], parts[2]);
  const auto pv = projection.to_vector<float>();
  // d loss / d y[b, h, i, j] = projection[b, i, h*D + j]: split the projection the same way.
  std::vector<float> pv3(pv.size() * 3, 0.0f);
  for (size_t r = 0; r < pv.size() / 6; ++r)
    for (size_t j = 0; j < 6; ++j) pv3[r * 18 + j] = pv[r * 6 + j];
  const Tensor proj_split = split_head(from_vector(pv3, {2, 5, 18}), heads, 0);
  backward(F::sum(F::mul(y, proj_split)));
  for (int64_t part = 0; part < 3; ++part) {
    const auto g = grad(parts[static_cast<size_t>(part)]);
    // Put the [B, H, T, D] gradient back into its third of [B, T, 3C] and compare.
    const auto merged_g = merge_heads(g);
    for (int64_t r = 0; r < 10; ++r)
      for (int64_t j = 0; j < 6; ++j)
        EXPECT_NEAR(packed[static_cast<size_t>(r * 18 + part * 6 + j)],
                    merged_g[static_cast<size_t>(r * 6 + j)], 1e-5)
            << "part " << part << " row " << r << " column " << j;
  }
}

TEST(Attention, GradientMatchesFiniteDifferences) {
  gradcheck([](auto& in) { return F::causal_self_attention(in[0], 2); }, {randn({2, 3, 3 * 4}, 85)},
            1e-2, 2e-3);
  gradcheck([](auto& in) { return F::causal_self_attention(in[0], 1); }, {randn({1, 4, 3 * 3}, 86)},
            1e-2, 2e-3);
}

// Note [causal blocks]: T = 150 is two whole row blocks of 64 and a partial one
// (22 rows), whose column products are cut short too; the checks above stay
// inside one block.
TEST(Attention, GradientMatchesFiniteDifferencesAcrossRowBlocks) {
  gradcheck([](auto& in) { return F::causal_self_attention(in[0], 2); },
            {randn({1, 150, 3 * 4}, 88)}, 1e-2, 2e-3);
}

// Changing qkv at positions > cut leaves outputs at positions <= cut bit for bit
// unchanged, and the gradient of output position cut reaches no position > cut.
TEST(Attention, OutputsAndGradientsDoNotDependOnLaterPositions) {
  const int64_t t = 6, c = 4, cut = 2;
  Tensor qkv = randn({2, t, 3 * c}, 87);
  auto values = qkv.to_vector<float>();
  for (size_t i = 0; i < values.size(); ++i)
    if (static_cast<int64_t>(i) / (3 * c) % t > cut) values[i] += 5.0f;
  const auto a = F::causal_self_attention(qkv, 2).to_vector<float>();
  const auto b = F::causal_self_attention(from_vector(values, qkv.shape()), 2).to_vector<float>();
  int64_t differ_later = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (static_cast<int64_t>(i) / c % t <= cut) {
      EXPECT_EQ(a[i], b[i]) << "element " << i;
    } else {
      differ_later += a[i] != b[i];
    }
  }
  EXPECT_GT(differ_later, 0) << "the change at later positions must reach later outputs";

  set_requires_grad(qkv, true);
  const Tensor y = F::causal_self_attention(qkv, 2);
  std::vector<float> pick(static_cast<size_t>(y.numel()), 0.0f);
  for (size_t i = 0; i < pick.size(); ++i)
    pick[i] = static_cast<int64_t>(i) / c % t == cut ? 1.0f : 0.0f;
  backward(F::sum(F::mul(y, from_vector(pick, y.shape()))));
  const auto g = grad(qkv).to_vector<float>();
  int64_t nonzero_before = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (static_cast<int64_t>(i) / (3 * c) % t > cut) {
      EXPECT_EQ(g[i], 0.0f) << "element " << i;
    } else {
      nonzero_before += g[i] != 0.0f;
    }
  }
  EXPECT_GT(nonzero_before, 0);
}

TEST(Attention, BadShapesNameTheShapeAndTheHeads) {
  std::string msg = value_error([] { causal_self_attention(randn({2, 3, 10}, 1), 2); });
  EXPECT_NE(msg.find("qkv [B, T, 3C] with C divisible by heads = 2, got shape [2, 3, 10]"),
            std::string::npos)
      << msg;
  msg = value_error([] { causal_self_attention(randn({3, 12}, 1), 2); });
  EXPECT_NE(msg.find("got shape [3, 12]"), std::string::npos) << msg;
  msg = value_error([] { causal_self_attention(randn({1, 3, 12}, 1), 0); });
  EXPECT_NE(msg.find("heads must be >= 1, got 0"), std::string::npos) << msg;
  const Tensor qkv = randn({1, 3, 12}, 2);
  const auto r = causal_self_attention(qkv, 2);
  msg = value_error([&] { causal_self_attention_backward(randn({1, 3, 5}, 3), qkv, r.probs, 2); });
  EXPECT_NE(msg.find("expects grad_y [1, 3, 4]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("got [1, 3, 5]"), std::string::npos) << msg;
}

// Note [fused attention]: the fused path is cuDNN's, for 16-bit CUDA tensors; asked for
// by name elsewhere it is an error naming the dtype and device. A packed result passed
// whole to the backward is its probs' backward.
TEST(Attention, FusedPathIsRefusedOnTheCpuAndPackedResultsPassWhole) {
  const Tensor qkv = randn({2, 5, 24}, 4);
  const std::string msg = value_error([&] { causal_self_attention(qkv, 2, AttentionPath::fused); });
  EXPECT_NE(msg.find("bf16 or f16 CUDA tensors, got f32 on cpu"), std::string::npos) << msg;
  const AttentionResult r = causal_self_attention(qkv, 2);
  EXPECT_FALSE(r.fused());
  EXPECT_FALSE(r.stats.defined());
  const Tensor gy = randn({2, 5, 8}, 5);
  EXPECT_EQ(causal_self_attention_backward(gy, qkv, r, 2).to_vector<float>(),
            causal_self_attention_backward(gy, qkv, r.probs, 2).to_vector<float>());
  const std::string undefined =
      value_error([&] { causal_self_attention_backward(gy, qkv, Tensor(), 2); });
  EXPECT_NE(undefined.find("pass the whole AttentionResult"), std::string::npos) << undefined;
}

}  // namespace
}  // namespace ddp
