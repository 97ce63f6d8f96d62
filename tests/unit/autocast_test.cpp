// Mixed precision on the CPU (Note [autocast], Note [gradient dtypes], Note [16-bit on
// the cpu], Note [fused classifier]): the dtype each op gives inside and outside an
// AutocastGuard, gradients reaching every input in its own dtype, the cast cache, the
// 16-bit ops against the f32 ops on the same (rounded) values, the fused classifier
// against the f32 softmax, and a GPT and an MLP trained under autocast next to f32.
// The CUDA kernels are checked against these CPU results in
// tests/gpu/mixed_precision_gpu_test.cpp.
#include "runtime/autograd/autocast.h"
#include "models/gpt.h"
#include "runtime/autograd/functions.h"
#include "runtime/nn/layers.h"
#include "runtime/ops/mixed_math.h"
#include "runtime/ops/ops.h"
#include "runtime/ops/transformer_ops.h"
#include "runtime/optim/optimizer.h"
#include "tests/unit/error_text.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace ddp {
namespace {

namespace F = functional;
namespace math = kernels::math;

Tensor bf16(const Tensor& t) {
  return cast(t, DType::bf16);
}
Tensor f32(const Tensor& t) {
  return cast(t, DType::f32);
}
Tensor cloned_leaf(const Tensor& t) {
  Tensor p = t.clone();
  set_requires_grad(p, true);
  return p;
}

void expect_equal(const Tensor& want, const Tensor& got, const char* what) {
  ASSERT_EQ(want.dtype(), got.dtype()) << what;
  ASSERT_EQ(want.shape(), got.shape()) << what;
  const auto a = f32(want).to_vector<float>(), b = f32(got).to_vector<float>();
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    ASSERT_EQ(a[i], b[i]) << what << ": element " << i;
  }
}

void expect_close(const Tensor& want, const Tensor& got, double rtol, double atol,
                  const char* what) {
  ASSERT_EQ(want.shape(), got.shape()) << what;
  const auto a = f32(want).to_vector<float>(), b = f32(got).to_vector<float>();
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_NEAR(a[i], b[i], atol + rtol * std::fabs(a[i])) << what << ": element " << i;
  }
}

using test_util::value_error;

// ---- the engine: Note [gradient dtypes] ------------------------------------------

TEST(GradientDtypes, ACastSendsTheGradientBackInTheInputsDtype) {
  Tensor x = cloned_leaf(randn({3, 4}, 1));
  const Tensor y = F::cast(x, DType::bf16);
  ASSERT_EQ(y.dtype(), DType::bf16);
  backward(F::sum(F::mul(y, y)));  // d/dx sum(y^2) = 2y, computed in bf16
  const Tensor g = grad(x);
  ASSERT_EQ(g.dtype(), DType::f32);
  expect_equal(f32(scale(y, 2.0f)), g, "2y as f32");
}

// As torch: a cast to an integer dtype is not differentiable, so its result does not
// require grad (a backward through it cast the seed to an integer and gave 0).
TEST(GradientDtypes, ACastToAnIntegerDoesNotRequireGrad) {
  Tensor x = cloned_leaf(from_vector<float>({0.6f, 2.4f}, {2}));
  for (DType d : {DType::i64, DType::i32, DType::u8}) {
    const Tensor y = F::cast(x, d);
    EXPECT_FALSE(requires_grad(y)) << dtype_name(d);
  }
  EXPECT_TRUE(requires_grad(F::cast(x, DType::bf16)));
}

TEST(GradientDtypes, ABf16LeafAddedToAnF32OneGetsABf16Gradient) {
  Tensor a = cloned_leaf(randn({5}, 2));
  Tensor b = cloned_leaf(bf16(randn({5}, 3)));
  const Tensor c = F::add(a, b);
  ASSERT_EQ(c.dtype(), DType::f32);  // promotion
  backward(F::sum(F::scale(c, 3.0f)));
  ASSERT_EQ(grad(a).dtype(), DType::f32);
  ASSERT_EQ(grad(b).dtype(), DType::bf16);
  expect_equal(full({5}, 3.0, {.dtype = DType::bf16}), grad(b), "3 in bf16");
}

// ---- the rules of Note [autocast] ------------------------------------------------

TEST(Autocast, EachOpGetsTheDtypeOfTheTable) {
  const Tensor x = randn({6, 8}, 4), w = cloned_leaf(randn({5, 8}, 5)),
               b = cloned_leaf(randn({5}, 6));
  const Tensor ln_w = cloned_leaf(ones({8})), ln_b = cloned_leaf(zeros({8}));
  const Tensor labels = from_vector<int64_t>({0, 1, 2, 3, 4, 0}, {6});
  {
    AutocastGuard guard;
    ASSERT_TRUE(autocast_enabled());
    EXPECT_EQ(F::linear(x, w, b).dtype(), DType::bf16);
    EXPECT_EQ(F::matmul(x, randn({8, 3}, 7)).dtype(), DType::bf16);
    EXPECT_EQ(F::bmm(randn({2, 3, 4}, 8), randn({2, 4, 5}, 9)).dtype(), DType::bf16);
    EXPECT_EQ(F::causal_self_attention(randn({2, 3, 12}, 10), 2).dtype(), DType::bf16);
    EXPECT_EQ(F::layer_norm(x, ln_w, ln_b).dtype(), DType::bf16);
    const Tensor h = F::linear(x, w, b);
    EXPECT_EQ(F::gelu(h).dtype(), DType::bf16);
    EXPECT_EQ(F::relu(h).dtype(), DType::bf16);
    EXPECT_EQ(F::softmax(h).dtype(), DType::f32);
    EXPECT_EQ(F::log_softmax(h).dtype(), DType::f32);
    EXPECT_EQ(F::cross_entropy(h, labels).dtype(), DType::f32);
    EXPECT_EQ(F::sum(h).dtype(), DType::f32);
    EXPECT_EQ(F::add(randn({6, 5}, 11), h).dtype(), DType::f32);
    EXPECT_EQ(F::embedding(ln_w.reshape({2, 4}), from_vector<int64_t>({1, 0}, {2})).dtype(),
              DType::f32);
    EXPECT_EQ(
        F::conv2d(randn({1, 2, 5, 5}, 12), cloned_leaf(randn({3, 2, 3, 3}, 13)), Tensor()).dtype(),
        DType::f32);
    {
      AutocastGuard off(DType::bf16, /*enabled=*/false);
      EXPECT_EQ(F::linear(x, w, b).dtype(), DType::f32);
      EXPECT_EQ(F::layer_norm(x, ln_w, ln_b).dtype(), DType::f32);
    }
    EXPECT_TRUE(autocast_enabled());
  }
  EXPECT_FALSE(autocast_enabled());
  EXPECT_EQ(F::linear(x, w, b).dtype(), DType::f32);
  EXPECT_EQ(F::layer_norm(x, ln_w, ln_b).dtype(), DType::f32);
}

TEST(Autocast, F16AndBadStatesAreRefusedByName) {
  EXPECT_NE(value_error([] { AutocastGuard g(DType::f16); }).find("f16 needs loss scaling"),
            std::string::npos);
  EXPECT_NE(value_error([] { AutocastGuard g(DType::f32); }).find("dtype f32"), std::string::npos);
  EXPECT_EQ(value_error([] { AutocastGuard g(DType::f16, /*enabled=*/false); }), "");
}

TEST(Autocast, Bf16NeedsComputeCapabilityEight) {
  const std::string msg =
      value_error([] { check_bf16_gpu("cuda:0", "Tesla V100-SXM2-16GB", 7, 0); });
  EXPECT_NE(msg.find("cuda:0 is a Tesla V100-SXM2-16GB of compute capability 7.0"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("--precision fp32"), std::string::npos) << msg;
  EXPECT_EQ(value_error([] { check_bf16_gpu("cuda:0", "NVIDIA H200", 9, 0); }), "");
  EXPECT_EQ(value_error([] { check_bf16_gpu("cuda:1", "NVIDIA A100", 8, 0); }), "");
}

TEST(Autocast, AParameterIsCastOncePerRegion) {
  const Tensor w = cloned_leaf(randn({4, 6}, 14));
  const Tensor x = randn({3, 6}, 15);
  {
    AutocastGuard guard;
    const int64_t before = autocast::cache_hits();
    const Tensor a = autocast::lower(w), b = autocast::lower(w);
    EXPECT_TRUE(a.is_same(b));
    EXPECT_EQ(autocast::cache_hits(), before + 1);
    EXPECT_FALSE(autocast::lower(x).is_same(autocast::lower(x)));  // not a parameter: no cache
    {
      AutocastGuard nested;
      EXPECT_TRUE(autocast::lower(w).is_same(a));  // the outermost region's cache
    }
  }
  AutocastGuard again;
  EXPECT_EQ(autocast::cache_hits(), 0);  // cleared with the outermost guard
  EXPECT_FALSE(autocast::lower(w).is_same(autocast::lower(randn({1}, 1))));
}

// A linear layer under autocast equals the f32 ops on bf16-rounded operands: the
// product and bias in f32, one rounding; the weight's and bias's gradients straight
// into f32, the input's in its own dtype.
TEST(Autocast, LinearIsTheF32ProductOfRoundedOperandsWithF32ParameterGradients) {
  const Tensor x0 = randn({7, 9}, 16);
  Tensor x = cloned_leaf(x0), w = cloned_leaf(randn({5, 9}, 17)), b = cloned_leaf(randn({5}, 18));
  const Tensor g = randn({7, 5}, 19);
  Tensor y;
  {
    AutocastGuard guard;
    y = F::linear(x, w, b);
  }
  const Tensor xr = f32(bf16(x0)), wr = f32(bf16(w)), gr = f32(bf16(g));
  const Tensor br = f32(bf16(b));  // the bias is cast too, as torch.autocast does
  expect_equal(bf16(add_bias_rows(matmul(xr, wr, {.trans_b = true}), br)), y, "forward");
  backward(y, bf16(g));
  ASSERT_EQ(grad(w).dtype(), DType::f32);
  ASSERT_EQ(grad(b).dtype(), DType::f32);
  ASSERT_EQ(grad(x).dtype(), DType::f32);
  expect_equal(matmul(gr, xr, {.trans_a = true}), grad(w), "weight gradient (f32, not rounded)");
  expect_equal(sum(gr, 0), grad(b), "bias gradient");
  expect_equal(matmul(gr, wr), grad(x), "input gradient");
}

// ---- the 16-bit ops (Note [16-bit on the cpu]) -----------------------------------

TEST(SixteenBitOps, ElementwiseOpsAreTheF32OpRoundedOnce) {
  const Tensor a = bf16(randn({33}, 20)), b = bf16(randn({33}, 21)), c = randn({33}, 22);
  expect_equal(bf16(add(f32(a), f32(b))), add(a, b), "add");
  expect_equal(bf16(sub(f32(a), f32(b))), sub(a, b), "sub");
  expect_equal(bf16(mul(f32(a), f32(b))), mul(a, b), "mul");
  expect_equal(add(f32(a), c), add(a, c), "bf16 + f32 = f32");
  expect_equal(mul(c, f32(b)), mul(c, b), "f32 * bf16 = f32");
  expect_equal(bf16(scale(f32(a), 0.3f)), scale(a, 0.3f), "scale");
  expect_equal(bf16(relu(f32(a))), relu(a), "relu");
  expect_equal(bf16(relu_backward(f32(b), f32(a))), relu_backward(b, a), "relu_backward");
  expect_equal(bf16(gelu(f32(a))), gelu(a), "gelu");
  expect_equal(bf16(gelu_backward(f32(b), f32(a))), gelu_backward(b, a), "gelu_backward");
  const Tensor m = bf16(randn({6, 11}, 23));
  expect_equal(sum(f32(m), 0), sum(m, 0), "sum along a dim is f32");
  expect_equal(sum(f32(m)), sum(m), "sum is f32");
  expect_equal(argmax(f32(m), 1), argmax(m, 1), "argmax");
  const Tensor bias = randn({11}, 24);
  expect_equal(bf16(add_bias_rows(f32(m), bias)), add_bias_rows(m, bias), "bias rows");
  EXPECT_NE(value_error([&] {
              add(a, from_vector<int32_t>(std::vector<int32_t>(33, 1), {33}));
            }).find("must be f32, bf16 or f16, got i32"),
            std::string::npos);
}

TEST(SixteenBitOps, MatmulOfBf16OperandsIntoF32IsNotRounded) {
  const Tensor a = bf16(randn({5, 12}, 25)), b = bf16(randn({12, 4}, 26));
  Tensor out = empty({5, 4});
  matmul_out(a, b, out);
  expect_equal(matmul(f32(a), f32(b)), out, "f32 out");
  expect_equal(bf16(matmul(f32(a), f32(b))), matmul(a, b), "bf16 out");
  Tensor wrong = empty({5, 4}, {.dtype = DType::f16});
  EXPECT_NE(value_error([&] { matmul_out(a, b, wrong); }).find("out have it or f32"),
            std::string::npos);
}

TEST(SixteenBitOps, LayerNormComputesInF32AndRoundsItsOutput) {
  const Tensor x = randn({4, 10}, 27), w = randn({10}, 28), bias = randn({10}, 29);
  const LayerNormResult want = layer_norm(x, w, bias);
  const LayerNormResult got = layer_norm(x, w, bias, 1e-5f, DType::bf16);
  expect_equal(bf16(want.out), got.out, "out");
  expect_equal(want.rstd, got.rstd, "rstd");
  const Tensor g = bf16(randn({4, 10}, 30));
  const LayerNormGrads gw = layer_norm_backward(f32(g), x, want, w);
  const LayerNormGrads gg = layer_norm_backward(g, x, got, w);
  expect_equal(gw.x, gg.x, "grad x (f32, as x)");
  expect_equal(gw.weight, gg.weight, "grad weight");
  expect_equal(gw.bias, gg.bias, "grad bias");
}

TEST(SixteenBitOps, AttentionOfBf16QkvIsTheF32AttentionRounded) {
  const Tensor qkv = bf16(randn({2, 5, 12}, 31));
  const AttentionResult want = causal_self_attention(f32(qkv), 2);
  const AttentionResult got = causal_self_attention(qkv, 2);
  expect_equal(bf16(want.y), got.y, "y");
  const Tensor gy = bf16(randn({2, 5, 4}, 32));
  expect_equal(bf16(causal_self_attention_backward(f32(gy), f32(qkv), want.probs, 2)),
               causal_self_attention_backward(gy, qkv, got.probs, 2), "grad qkv");
}

// ---- Note [fused classifier] -----------------------------------------------------

TEST(FusedClassifier, MathMatchesTheDirectFormulas) {
  const std::vector<float> row = {0.5f, -3.0f, 2.25f, 7.0f, -0.125f, 1.0f, 6.5f};
  math::SoftmaxStats left{-std::numeric_limits<float>::infinity(), 0.0f}, right = left;
  math::SoftmaxStats all = left;
  double max = -1e30, sum = 0.0;
  for (float v : row) max = std::max(max, static_cast<double>(v));
  for (float v : row) sum += std::exp(v - max);
  for (size_t i = 0; i < row.size(); ++i) {
    all = math::softmax_stats_add(all, row[i]);
    (i < 3 ? left : right) = math::softmax_stats_add(i < 3 ? left : right, row[i]);
  }
  const math::SoftmaxStats merged = math::softmax_stats_merge(left, right);
  const math::SoftmaxStats reversed = math::softmax_stats_merge(right, left);
  for (const auto& s : {all, merged, reversed}) {
    EXPECT_FLOAT_EQ(s.max, static_cast<float>(max));
    EXPECT_NEAR(s.sum, sum, 1e-5 * sum);
  }
  // -inf (a masked logit) adds nothing, first or later, alone or merged.
  const float inf = std::numeric_limits<float>::infinity();
  math::SoftmaxStats masked = math::softmax_stats_add({-inf, 0.0f}, -inf);
  EXPECT_EQ(masked.sum, 0.0f);
  masked = math::softmax_stats_add(masked, 2.0f);
  masked = math::softmax_stats_add(masked, -inf);
  EXPECT_EQ(masked.max, 2.0f);
  EXPECT_EQ(masked.sum, 1.0f);
  const math::SoftmaxStats none = math::softmax_stats_add({-inf, 0.0f}, -inf);
  EXPECT_EQ(math::softmax_stats_merge(none, masked).sum, 1.0f);
  EXPECT_EQ(math::softmax_stats_merge(masked, none).sum, 1.0f);
  const float lse = static_cast<float>(max + std::log(sum));
  EXPECT_NEAR(math::xent_grad(row[3], lse, true, 0.5f), 0.5 * (std::exp(row[3] - max) / sum - 1.0),
              1e-6);
  EXPECT_NEAR(math::xent_grad(row[1], lse, false, 0.5f), 0.5 * std::exp(row[1] - max) / sum, 1e-9);
}

TEST(FusedClassifier, Bf16LogitsGiveTheF32LossWithoutKeepingProbabilities) {
  const Tensor logits = bf16(scale(randn({9, 37}, 33), 4.0f));
  const Tensor labels = from_vector<int64_t>({0, 36, 5, 5, 17, 2, 30, 11, 8}, {9});
  const CrossEntropyResult want = softmax_cross_entropy(f32(logits), labels);
  const CrossEntropyResult got = softmax_cross_entropy(logits, labels);
  EXPECT_FALSE(got.probs.defined());
  ASSERT_TRUE(got.lse.defined());
  EXPECT_EQ(got.lse.shape(), Shape({9}));
  EXPECT_NEAR(got.loss.item<float>(), want.loss.item<float>(), 1e-6);
  const Tensor g = full({}, 1.7);
  const Tensor gw = softmax_cross_entropy_backward(want.probs, labels, g);
  const Tensor gg = softmax_cross_entropy_backward_from_logits(logits, got.lse, labels, g);
  ASSERT_EQ(gg.dtype(), DType::bf16);
  // One bf16 rounding of the same value, give or take the recomputed exp.
  expect_close(gw, gg, 1.0 / 128, 1e-6, "grad logits");
  const Tensor bad = from_vector<int64_t>({0, 37, 5, 5, 17, 2, 30, 11, 8}, {9});
  EXPECT_NE(value_error([&] { softmax_cross_entropy(logits, bad); }).find("label 37 of row 1"),
            std::string::npos);
}

// ---- whole models ----------------------------------------------------------------

// gpt-tiny-sized: one forward and backward under autocast next to f32 from the same
// weights. The loss within 1%, every parameter's gradient f32 and within a bf16
// model's distance of the f32 one (relative norm of the difference < 5%).
TEST(AutocastModels, GptLossAndGradientsTrackF32) {
  Generator gen(7);
  auto model =
      models::make_gpt(models::gpt_config("gpt:layers=2,d=32,heads=4,ctx=16,vocab=50"), gen);
  std::vector<int64_t> ids(2 * 16);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * 7 + 3) % 50);
  const Tensor tokens = from_vector(ids, {2, 16});
  std::vector<int64_t> next(ids.begin() + 1, ids.end());
  next.push_back(0);
  const Tensor targets = from_vector(next, {32});
  const auto run = [&](bool mixed) {
    for (Tensor& p : model->parameters()) set_grad(p, Tensor());
    Tensor loss;
    {
      AutocastGuard guard(DType::bf16, mixed);
      const Tensor logits = model->forward(tokens);
      EXPECT_EQ(logits.dtype(), mixed ? DType::bf16 : DType::f32);
      loss = F::cross_entropy(F::reshape(logits, {32, 50}), targets);
    }
    backward(loss);
    std::vector<Tensor> grads;
    for (const Tensor& p : model->parameters()) grads.push_back(grad(p).clone());
    return std::make_pair(loss.item<float>(), grads);
  };
  const auto [loss32, grads32] = run(false);
  const auto [loss16, grads16] = run(true);
  EXPECT_NEAR(loss16, loss32, 0.01 * loss32);
  ASSERT_EQ(grads16.size(), grads32.size());
  for (size_t i = 0; i < grads16.size(); ++i) {
    ASSERT_EQ(grads16[i].dtype(), DType::f32) << "parameter " << i;
    const auto a = grads32[i].to_vector<float>(), b = grads16[i].to_vector<float>();
    double diff = 0.0, norm = 0.0;
    for (size_t j = 0; j < a.size(); ++j) {
      diff += (a[j] - b[j]) * (a[j] - b[j]);
      norm += static_cast<double>(a[j]) * a[j];
    }
    EXPECT_LT(std::sqrt(diff), 0.05 * std::sqrt(norm) + 1e-7) << "parameter " << i;
  }
}

// 60 SGD steps of a small MLP on a fixed batch: the bf16 loss follows the f32 one and
// both fall (the weights, their gradients and the momentum stay f32).
TEST(AutocastModels, MlpTrainsAsF32Does) {
  const Tensor x = randn({32, 20}, 40);
  std::vector<int64_t> y(32);
  for (size_t i = 0; i < y.size(); ++i) y[i] = static_cast<int64_t>(i % 4);
  const Tensor labels = from_vector(y, {32});
  const auto train = [&](bool mixed) {
    Generator gen(3);
    nn::Linear l1(20, 16, gen), l2(16, 4, gen);
    std::vector<Tensor> params = l1.parameters();
    for (const Tensor& p : l2.parameters()) params.push_back(p);
    optim::SGD sgd(params, {.lr = 0.1f, .momentum = 0.9f});
    std::vector<float> losses;
    for (int step = 0; step < 60; ++step) {
      sgd.zero_grad(true);
      Tensor loss;
      {
        AutocastGuard guard(DType::bf16, mixed);
        loss = F::cross_entropy(l2.forward(F::relu(l1.forward(x))), labels);
      }
      backward(loss);
      for (const Tensor& p : params) EXPECT_EQ(grad(p).dtype(), DType::f32);
      sgd.step();
      losses.push_back(loss.item<float>());
    }
    return losses;
  };
  const auto l32 = train(false), l16 = train(true);
  EXPECT_LT(l32.back(), 0.5f * l32.front());
  EXPECT_LT(l16.back(), 0.5f * l16.front());
  for (size_t i = 0; i < l32.size(); i += 10) {
    EXPECT_NEAR(l16[i], l32[i], 0.02 * l32[i] + 0.01) << "step " << i;
  }
}

}  // namespace
}  // namespace ddp
