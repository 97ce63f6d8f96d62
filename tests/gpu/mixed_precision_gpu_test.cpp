// The 16-bit CUDA kernels of mixed precision (Note [autocast]) against the CPU
// (tests/unit/autocast_test.cpp checks the CPU against the f32 ops on the same rounded
// values). Elementwise kernels compute each element in f32 and round once, as the CPU
// does, so they agree to one bf16 rounding (relative 2^-8: an f32 result a few ulps
// apart may round the other way); sums and products in another order agree within
// the stated tolerances. Without a GPU every test skips and says why.
#include "models/gpt.h"
#include "runtime/autograd/autocast.h"
#include "runtime/autograd/functions.h"
#include "runtime/ops/cuda/linear_lt.h"
#include "runtime/ops/ops.h"
#include "runtime/ops/transformer_ops.h"
#include "tests/gpu/elementwise_compare.h"
#include "tests/gpu/require_gpu.h"

#include <gtest/gtest.h>

#include "runtime/fmt.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace ddp {
namespace {

namespace F = functional;

using gpu_test::kGpu;
// One bf16 step, relative: two f32 results a few ulps apart (another summation order,
// an FMA, the device's tanhf) may round to neighbouring bf16 values, 2^-8 to 2^-7 apart.
constexpr double kBf16Rounding = 1.0 / 128;

Tensor bf16(const Tensor& t) {
  return cast(t, DType::bf16);
}

using gpu_test::expect_close;

double max_abs(const Tensor& t);

// A process-wide switch of ops/cuda/linear_lt.h set for a test and restored when it
// ends, an ASSERT's early return included.
class SwitchGuard {
 public:
  SwitchGuard(bool (*get)(), void (*set)(bool), bool value) : set_(set), was_(get()) {
    set_(value);
  }
  ~SwitchGuard() { set_(was_); }
  SwitchGuard(const SwitchGuard&) = delete;
  SwitchGuard& operator=(const SwitchGuard&) = delete;

 private:
  void (*set_)(bool);
  bool was_;
};

TEST(MixedPrecisionGpu, ElementwiseKernelsRoundOnceAsTheCpu) {
  DDP_REQUIRE_CUDA();
  const Tensor a = bf16(randn({1000, 37}, 1)), b = bf16(randn({1000, 37}, 2));
  const Tensor c = randn({1000, 37}, 3), bias = randn({37}, 4);
  const Tensor ga = a.to(kGpu), gb = b.to(kGpu), gc = c.to(kGpu), gbias = bias.to(kGpu);
  const double r = kBf16Rounding;
  expect_close(add(ga, gb), add(a, b), r, 0, "bf16 + bf16");
  expect_close(sub(ga, gb), sub(a, b), r, 0, "bf16 - bf16");
  expect_close(mul(ga, gb), mul(a, b), r, 0, "bf16 * bf16");
  expect_close(add(gc, ga), add(c, a), 1e-7, 0, "f32 + bf16 = f32");
  expect_close(mul(ga, gc), mul(a, c), 1e-7, 0, "bf16 * f32 = f32");
  expect_close(scale(ga, -0.7f), scale(a, -0.7f), r, 0, "scale");
  expect_close(relu(ga), relu(a), 0, 0, "relu");
  expect_close(relu_backward(gb, ga), relu_backward(b, a), 0, 0, "relu_backward");
  for (const auto op : {kernels::UnaryOp::tanh, kernels::UnaryOp::sigmoid, kernels::UnaryOp::silu,
                        kernels::UnaryOp::abs}) {
    const std::string name = "unary " + std::to_string(static_cast<int>(op));
    expect_close(unary(op, ga), unary(op, a), r, 1e-6, name);
    expect_close(unary(op, gc), unary(op, c), 1e-6, 1e-7, name + " (f32)");
    expect_close(unary_backward(op, gb, ga), unary_backward(op, b, a), r, 1e-6, name + "'");
  }
  // nvcc may fuse l * t into the subtraction (an FMA; the CPU builds with
  // -ffp-contract=off): where the terms cancel, half an ulp of l * t (up to ~1.2e-7)
  // survives, so the floor is 1e-6.
  expect_close(bce_with_logits(gc, cast(gb, DType::f32)), bce_with_logits(c, cast(b, DType::f32)),
               1e-6, 1e-6, "bce with logits");
  expect_close(bce_with_logits_grad(gc, cast(gb, DType::f32)),
               bce_with_logits_grad(c, cast(b, DType::f32)), 1e-6, 1e-6, "its gradient");
  expect_close(gelu(ga), gelu(a), r, 1e-6, "gelu");
  expect_close(gelu_backward(gb, ga), gelu_backward(b, a), r, 1e-6, "gelu_backward");
  const Tensor rows = a.reshape({1000, 37}), grows = ga.reshape({1000, 37});
  expect_close(add_bias_rows(grows, gbias), add_bias_rows(rows, bias), r, 0, "bias rows");
  expect_close(sum(grows, 0), sum(rows, 0), 1e-6, 1e-6, "sum along rows (f32)");
  expect_close(sum(grows, 1), sum(rows, 1), 1e-6, 1e-6, "sum along columns (f32)");
  expect_close(sum(grows), sum(rows), 1e-6, 1e-5, "sum (f32)");
  expect_close(argmax(grows, 1), argmax(rows, 1), 0, 0, "argmax");
}

// linear's bias epilogue and the mixed GEMMs at GPT-2-like shapes (cuBLAS adds in its
// own order: the tolerance is relative to the row's scale).
TEST(MixedPrecisionGpu, LinearAndMixedGemmsMatchTheCpu) {
  DDP_REQUIRE_CUDA();
  for (const auto& [n, in, out] : std::vector<std::array<int64_t, 3>>{
           {7, 5, 3}, {256, 768, 2304}, {512, 3072, 768}, {33, 64, 50257}}) {
    const Tensor x = bf16(randn({n, in}, 5)), w = bf16(scale(randn({out, in}, 6), 0.02f));
    const Tensor bias = randn({out}, 7), bias16 = bf16(bias);
    const std::string shape = fmt::format("[{}, {}] x [{}, {}]^T", n, in, out, in);
    const double atol = 1e-3 * std::sqrt(static_cast<double>(in)) * 0.02;
    expect_close(linear(x.to(kGpu), w.to(kGpu), bias.to(kGpu)), linear(x, w, bias), kBf16Rounding,
                 atol, "linear " + shape);
    expect_close(linear(x.to(kGpu), w.to(kGpu), Tensor()), linear(x, w, Tensor()), kBf16Rounding,
                 atol, "linear without bias " + shape);
    // A bf16 bias, as autocast passes it: cuBLASLt's bias epilogue (Note [cublasLt linear]).
    expect_close(linear(x.to(kGpu), w.to(kGpu), bias16.to(kGpu)), linear(x, w, bias16),
                 kBf16Rounding, atol, "linear with a bf16 bias " + shape);
    Tensor want = empty({out, in}), got = empty({out, in}, {.device = kGpu});
    const Tensor g = bf16(randn({n, out}, 8));
    matmul_out(g, x, want, {.trans_a = true});
    matmul_out(g.to(kGpu), x.to(kGpu), got, {.trans_a = true});
    expect_close(got, want, 1e-5, 1e-3 * std::sqrt(static_cast<double>(n)),
                 "weight gradient into f32 " + shape);
  }
}

TEST(MixedPrecisionGpu, LayerNormWritesBf16AndTakesBf16Gradients) {
  DDP_REQUIRE_CUDA();
  for (const auto& [rows, d] : std::vector<std::array<int64_t, 2>>{{3, 5}, {1024, 768}}) {
    const Tensor x = randn({rows, d}, 9), w = randn({d}, 10), b = randn({d}, 11);
    const LayerNormResult want = layer_norm(x, w, b, 1e-5f, DType::bf16);
    const LayerNormResult got = layer_norm(x.to(kGpu), w.to(kGpu), b.to(kGpu), 1e-5f, DType::bf16);
    expect_close(got.out, want.out, kBf16Rounding, 1e-6, "out");
    expect_close(got.rstd, want.rstd, 1e-6, 0, "rstd");
    const Tensor g = bf16(randn({rows, d}, 12));
    const LayerNormGrads gw = layer_norm_backward(g, x, want, w);
    const LayerNormGrads gg = layer_norm_backward(g.to(kGpu), x.to(kGpu), got, w.to(kGpu));
    expect_close(gg.x, gw.x, 1e-5, 1e-5, "grad x");
    expect_close(gg.weight, gw.weight, 1e-5, 1e-4, "grad weight");
    expect_close(gg.bias, gw.bias, 1e-5, 1e-4, "grad bias");
  }
}

// Note [fused classifier] at a small shape and GPT-2's vocabulary: the loss and lse
// from bf16 logits, the gradient in bf16, a label out of range as a NaN loss.
TEST(MixedPrecisionGpu, FusedClassifierMatchesTheCpu) {
  DDP_REQUIRE_CUDA();
  for (const auto& [rows, classes] : std::vector<std::array<int64_t, 2>>{{5, 3}, {64, 50257}}) {
    const Tensor logits = bf16(scale(randn({rows, classes}, 13), 3.0f));
    std::vector<int64_t> y(static_cast<size_t>(rows));
    for (size_t i = 0; i < y.size(); ++i) y[i] = static_cast<int64_t>((i * 7919) % classes);
    const Tensor labels = from_vector(y, {rows});
    const CrossEntropyResult want = softmax_cross_entropy(logits, labels);
    const CrossEntropyResult got = softmax_cross_entropy(logits.to(kGpu), labels.to(kGpu));
    EXPECT_FALSE(got.probs.defined());
    expect_close(got.loss, want.loss, 1e-5, 0, "loss");
    expect_close(got.lse, want.lse, 1e-6, 1e-5, "lse");
    const Tensor g = full({}, 0.75);
    expect_close(softmax_cross_entropy_backward_from_logits(logits.to(kGpu), got.lse,
                                                            labels.to(kGpu), g.to(kGpu)),
                 softmax_cross_entropy_backward_from_logits(logits, want.lse, labels, g),
                 kBf16Rounding, 1e-9, "grad logits");
  }
  const Tensor logits = bf16(randn({2, 4}, 14)).to(kGpu);
  const Tensor bad = from_vector<int64_t>({1, 4}, {2}).to(kGpu);
  EXPECT_TRUE(std::isnan(softmax_cross_entropy(logits, bad).loss.item<float>()));
  // -inf logits (a masked or padded vocabulary) add nothing: rows whose first and
  // whole columns of a thread are -inf give the CPU's finite loss, not NaN.
  std::vector<float> masked(3 * 600);
  for (size_t i = 0; i < masked.size(); ++i) {
    masked[i] = (i % 600 < 300 || i % 7 == 0) ? -INFINITY : static_cast<float>(i % 13) * 0.25f;
  }
  const Tensor mlogits = bf16(from_vector(masked, {3, 600}));
  // Labels on finite logits (flat indices 302, 1051, 1798: none a multiple of 7).
  const Tensor mlabels = from_vector<int64_t>({302, 451, 598}, {3});
  const CrossEntropyResult mw = softmax_cross_entropy(mlogits, mlabels);
  const CrossEntropyResult mg = softmax_cross_entropy(mlogits.to(kGpu), mlabels.to(kGpu));
  ASSERT_TRUE(std::isfinite(mw.loss.item<float>()));
  expect_close(mg.loss, mw.loss, 1e-5, 0, "loss with -inf logits");
}

// Note [weight gradient epilogue]: linear's weight gradient and its bias gradient
// from one cuBLASLt matmul (BGRADB), into f32, at GPT-2's four linear layers and a
// small odd shape, against the CPU (the product of the same bf16 values in f32, the
// column sums in double). The fused path must be the one that ran: a cuBLASLt that
// refuses the epilogue fails here, naming the shape (the runtime would fall back).
TEST(MixedPrecisionGpu, WeightAndBiasGradientsFromOneMatmulMatchTheCpu) {
  DDP_REQUIRE_REAL_CUDA("cuBLASLt");
  const SwitchGuard on(kernels::cuda::lt_bias_grad_enabled, kernels::cuda::set_lt_bias_grad_enabled,
                       true);
  for (const auto& [n, in, out] : std::vector<std::array<int64_t, 3>>{
           {7, 5, 3}, {1024, 768, 2304}, {1024, 768, 768}, {1024, 768, 3072}, {1024, 3072, 768}}) {
    const std::string shape = fmt::format("grad [{}, {}], input [{}, {}]", n, out, n, in);
    const Tensor x = bf16(randn({n, in}, 21)), g = bf16(randn({n, out}, 22));
    Tensor gw = empty({out, in}, {.device = kGpu}), gb = empty({out}, {.device = kGpu});
    Tensor want_w = empty({out, in});
    matmul_out(g, x, want_w, {.trans_a = true});
    const double atol = 1e-3 * std::sqrt(static_cast<double>(n));
    // GPT-2's shapes must take the fused path; the odd one (features not multiples of 8)
    // does not, and linear_param_grads below checks the fallback.
    const bool fused = kernels::cuda::linear_weight_grad_lt(g.to(kGpu), x.to(kGpu), gw, gb);
    if (in % 8 == 0 && out % 8 == 0) {
      ASSERT_TRUE(fused) << "cuBLASLt has no BGRADB algorithm for " << shape
                         << " (bf16 into f32): the bias gradient falls back to a column sum";
    } else {
      EXPECT_FALSE(fused) << shape << ": features not multiples of 8 are left to the fallback";
    }
    if (fused) {
      expect_close(gw, want_w, 1e-5, atol, "weight gradient " + shape);
      expect_close(gb, sum(g, 0), 1e-5, atol, "bias gradient " + shape);
    }
    // The op the autograd engine calls gives the same, into memory it is handed.
    Tensor into = empty({out, in}, {.device = kGpu});
    const LinearParamGrads p = linear_param_grads(g.to(kGpu), x.to(kGpu), DType::f32, true, into);
    EXPECT_EQ(p.weight.data_ptr(), into.data_ptr());
    expect_close(p.weight, want_w, 1e-5, atol, "linear_param_grads weight " + shape);
    expect_close(p.bias, sum(g, 0), 1e-5, atol, "linear_param_grads bias " + shape);
  }
}

// Note [gelu epilogues]: c_fc's matmul with GELU_AUX_BIAS and c_proj's input gradient
// with DGELU against the CPU's ops on the same bf16 values, at GPT-2's MLP (768 ->
// 3072 -> 768) and gpt-mini's; cuBLASLt must take them (a refusal fails, naming the
// shape; the runtime would fall back). The GELU must be GPT-2's tanh form: at x = -3
// it and the erf form differ by 11%, far beyond a bf16 rounding.
TEST(MixedPrecisionGpu, GeluEpiloguesMatchTheCpu) {
  DDP_REQUIRE_REAL_CUDA("cuBLASLt");
  const SwitchGuard on(gelu_epilogues_enabled, set_gelu_epilogues_enabled, true);
  for (const auto& [n, c] : std::vector<std::array<int64_t, 2>>{{512, 768}, {256, 384}}) {
    const std::string shape = fmt::format("[{}, {}] -> [{}, {}]", n, c, n, 4 * c);
    const Tensor x = bf16(randn({n, c}, 41)), w_fc = bf16(scale(randn({4 * c, c}, 42), 0.05f));
    const Tensor b_fc = bf16(randn({4 * c}, 43)),
                 w_proj = bf16(scale(randn({c, 4 * c}, 44), 0.02f));
    const TensorOptions on_gpu{.dtype = DType::bf16, .device = kGpu};
    Tensor h = empty({n, 4 * c}, on_gpu), pre = empty({n, 4 * c}, on_gpu);
    ASSERT_TRUE(kernels::cuda::linear_gelu_lt(x.to(kGpu), w_fc.to(kGpu), b_fc.to(kGpu), h, pre))
        << "cuBLASLt has no GELU_AUX_BIAS algorithm for " << shape;
    const Tensor want_pre = linear(x, w_fc, b_fc);
    const double atol = 1e-3 * std::sqrt(static_cast<double>(c)) * 0.05;
    expect_close(pre, want_pre, kBf16Rounding, atol, "pre " + shape);
    // GELU of the f32 sum in the epilogue, of the bf16 pre on the CPU: one more rounding.
    expect_close(h, gelu(want_pre), 2 * kBf16Rounding, atol, "gelu " + shape);
    const LinearGelu op = linear_gelu(x.to(kGpu), w_fc.to(kGpu), b_fc.to(kGpu));
    expect_close(op.out, gelu(want_pre), 2 * kBf16Rounding, atol, "linear_gelu " + shape);
    const Tensor g = bf16(randn({n, c}, 45));
    Tensor grad_pre = empty({n, 4 * c}, on_gpu);
    ASSERT_TRUE(kernels::cuda::linear_input_grad_dgelu_lt(g.to(kGpu), w_proj.to(kGpu),
                                                          want_pre.to(kGpu), grad_pre))
        << "cuBLASLt has no DGELU algorithm for " << shape;
    const Tensor want = gelu_backward(matmul(g, w_proj), want_pre);
    const double gatol = 1e-3 * std::sqrt(static_cast<double>(c)) * 0.02;
    expect_close(grad_pre, want, 2 * kBf16Rounding, gatol, "dgelu " + shape);
    expect_close(linear_input_grad_gelu(g.to(kGpu), w_proj.to(kGpu), want_pre.to(kGpu)), want,
                 2 * kBf16Rounding, gatol, "linear_input_grad_gelu " + shape);
  }
  // The tanh form: pre = diag(w) through an identity input.
  const std::vector<float> w = {-3.0f, -2.5f, -1.0f, 0.0f, 0.5f, 1.0f, 2.0f, 3.0f};
  std::vector<float> eye(64, 0.0f), diag(64, 0.0f);
  for (size_t i = 0; i < 8; ++i) {
    eye[i * 9] = 1.0f;
    diag[i * 9] = w[i];
  }
  const Tensor x8 = bf16(from_vector(eye, {8, 8})), w8 = bf16(from_vector(diag, {8, 8}));
  const Tensor b8 = bf16(zeros({8}));
  const TensorOptions on_gpu{.dtype = DType::bf16, .device = kGpu};
  Tensor h8 = empty({8, 8}, on_gpu), pre8 = empty({8, 8}, on_gpu);
  ASSERT_TRUE(kernels::cuda::linear_gelu_lt(x8.to(kGpu), w8.to(kGpu), b8.to(kGpu), h8, pre8));
  expect_close(h8, gelu(linear(x8, w8, b8)), 2 * kBf16Rounding, 1e-6,
               "GELU's tanh form on the diagonal -3 .. 3");
}

// F::gelu_mlp under autocast: with the epilogues and without them (the three ops' kernels),
// forward and every gradient, within bf16 roundings of each other.
TEST(MixedPrecisionGpu, GeluMlpWithEpiloguesMatchesTheThreeOps) {
  DDP_REQUIRE_CUDA();
  const auto run = [](bool epilogues) {
    const SwitchGuard on(gelu_epilogues_enabled, set_gelu_epilogues_enabled, epilogues);
    std::vector<Tensor> in{
        randn({512, 384}, 51).to(kGpu), scale(randn({1536, 384}, 52), 0.05f).to(kGpu),
        randn({1536}, 53).to(kGpu), scale(randn({384, 1536}, 54), 0.02f).to(kGpu),
        randn({384}, 55).to(kGpu)};
    for (Tensor& t : in) set_requires_grad(t, true);
    Tensor y;
    {
      const AutocastGuard autocast(DType::bf16);
      y = F::gelu_mlp(in[0], in[1], in[2], in[3], in[4]);
    }
    backward(F::sum(F::mul(F::cast(y, DType::f32), randn({512, 384}, 56).to(kGpu))));
    std::vector<Tensor> out{y};
    for (const Tensor& t : in) out.push_back(grad(t));
    return out;
  };
  const auto fused = run(true), apart = run(false);
  const char* names[] = {"y", "x", "fc weight", "fc bias", "proj weight", "proj bias"};
  for (size_t i = 0; i < fused.size(); ++i) {
    const double scale_of = max_abs(apart[i]);
    expect_close(fused[i], apart[i].cpu(), 4 * kBf16Rounding, 1e-2 * scale_of, names[i]);
  }
}

double max_abs(const Tensor& t) {
  double m = 0.0;
  for (float v : cast(t.cpu(), DType::f32).to_vector<float>())
    m = std::max(m, std::fabs(double{v}));
  return m;
}

// Note [16-bit attention on cuda]: the products on tensor cores, the probabilities and
// dS stored in bf16 (the CPU keeps them in f32): within a few bf16 steps of the
// largest element.
TEST(MixedPrecisionGpu, AttentionOfBf16QkvMatchesTheCpu) {
  DDP_REQUIRE_CUDA();
  const Tensor qkv = bf16(randn({2, 64, 3 * 96}, 15));
  const AttentionResult want = causal_self_attention(qkv, 4);
  const AttentionResult got = causal_self_attention(qkv.to(kGpu), 4, AttentionPath::packed);
  EXPECT_EQ(got.probs.dtype(), DType::bf16);
  expect_close(got.y, want.y, kBf16Rounding, 0.02 * max_abs(want.y), "y");
  const Tensor gy = bf16(randn({2, 64, 96}, 16));
  const Tensor want_grad = causal_self_attention_backward(gy, qkv, want.probs, 4);
  expect_close(causal_self_attention_backward(gy.to(kGpu), qkv.to(kGpu), got.probs, 4), want_grad,
               kBf16Rounding, 0.02 * max_abs(want_grad), "grad qkv");
}

// Each row's log-sum-exp of its scaled, causally masked scores, from qkv [B, T, 3C] on
// the CPU in double: what the fused attention's stats [B, H, T, 1] hold.
std::vector<double> row_log_sum_exp(const Tensor& qkv, int64_t heads) {
  const auto x = cast(qkv, DType::f32).to_vector<float>();
  const int64_t b_n = qkv.size(0), t_n = qkv.size(1), c = qkv.size(2) / 3, d = c / heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const auto at = [&](int64_t b, int64_t t, int64_t part, int64_t h, int64_t e) {
    return double{x[static_cast<size_t>(((b * t_n + t) * 3 + part) * c + h * d + e)]};
  };
  std::vector<double> lse;
  for (int64_t b = 0; b < b_n; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < t_n; ++i) {
        std::vector<double> s;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0.0;
          for (int64_t e = 0; e < d; ++e) dot += at(b, i, 0, h, e) * at(b, j, 1, h, e);
          s.push_back(dot * scale);
        }
        const double m = *std::max_element(s.begin(), s.end());
        double sum = 0.0;
        for (double v : s) sum += std::exp(v - m);
        lse.push_back(m + std::log(sum));
      }
    }
  }
  return lse;
}

// Note [fused attention]: cuDNN's fused attention, asked for by name (so a GPU where it
// cannot run fails here with cuDNN's reason), against the CPU's f32 attention on the
// same bf16 inputs: y and grad_qkv within a few bf16 steps of the largest element as
// the packed kernels are, stats (f32, never rounded to bf16) within 1e-3, no [B, H, T,
// T] tensor kept, and the backward deterministic: two runs equal bit for bit. The
// shapes: gpt-mini's heads, GPT-2's (T 1024, D 64), an odd T and a head of 16, and a
// head of 16 at T 128. Before cuDNN 9.16 a T that is not a multiple of 128 is refused
// by name (its backward needs a padding mask there), which such a cuDNN must say for
// T 64 and 17.
TEST(MixedPrecisionGpu, FusedAttentionMatchesTheCpu) {
  DDP_REQUIRE_REAL_CUDA("cuDNN's fused attention");
  struct Shape4 {
    int64_t b, t, heads, d;
  };
  uint64_t seed = 60;
  for (const Shape4& k : {Shape4{2, 64, 4, 64}, Shape4{1, 1024, 12, 64}, Shape4{3, 17, 2, 16},
                          Shape4{2, 128, 2, 16}}) {
    SCOPED_TRACE(fmt::format("B {}, T {}, {} heads of {}", k.b, k.t, k.heads, k.d));
    const int64_t c = k.heads * k.d;
    const Tensor qkv = bf16(randn({k.b, k.t, 3 * c}, ++seed));
    const AttentionResult want = causal_self_attention(qkv, k.heads);
    AttentionResult got;
    try {
      got = causal_self_attention(qkv.to(kGpu), k.heads, AttentionPath::fused);
    } catch (const DeviceError& e) {
      const std::string what = e.what();
      if (k.t % 128 == 0 || what.find("which cuDNN before 9.16 needs") == std::string::npos) throw;
      std::printf("T %lld refused by name on this cuDNN: %s\n", static_cast<long long>(k.t),
                  what.c_str());
      continue;
    }
    ASSERT_TRUE(got.fused());
    EXPECT_FALSE(got.probs.defined());
    ASSERT_EQ(got.stats.shape(), Shape({k.b, k.heads, k.t, 1}));
    ASSERT_EQ(got.stats.dtype(), DType::f32);
    expect_close(got.y, want.y, kBf16Rounding, 0.02 * max_abs(want.y), "y");
    const std::vector<double> lse = row_log_sum_exp(qkv, k.heads);
    const auto stats = got.stats.cpu().to_vector<float>();
    for (size_t i = 0; i < lse.size(); ++i) {
      ASSERT_NEAR(stats[i], lse[i], 1e-3 * std::max(1.0, std::fabs(lse[i]))) << "stats row " << i;
    }
    const Tensor gy = bf16(randn({k.b, k.t, c}, ++seed));
    const Tensor want_grad = causal_self_attention_backward(gy, qkv, want.probs, k.heads);
    const Tensor grad = causal_self_attention_backward(gy.to(kGpu), qkv.to(kGpu), got, k.heads);
    expect_close(grad, want_grad, kBf16Rounding, 0.02 * max_abs(want_grad), "grad qkv");
    const Tensor again = causal_self_attention_backward(gy.to(kGpu), qkv.to(kGpu), got, k.heads);
    EXPECT_EQ(cast(again.cpu(), DType::f32).to_vector<float>(),
              cast(grad.cpu(), DType::f32).to_vector<float>())
        << "the fused backward is not deterministic";
  }
}

// What the fused attention cannot take falls back to the packed kernels under the
// automatic path (probs kept), and is an error naming it when asked for by name.
TEST(MixedPrecisionGpu, FusedAttentionRefusesHeadsItCannotTake) {
  DDP_REQUIRE_REAL_CUDA("cuDNN's fused attention");
  const Tensor qkv = bf16(randn({2, 16, 3 * 36}, 70)).to(kGpu);  // 3 heads of 12
  const AttentionResult packed = causal_self_attention(qkv, 3);
  EXPECT_FALSE(packed.fused());
  EXPECT_TRUE(packed.probs.defined());
  try {
    (void)causal_self_attention(qkv, 3, AttentionPath::fused);
    ADD_FAILURE() << "a head of 12 ran fused";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("head size 12"), std::string::npos) << e.what();
  }
}

// A GPT step under autocast on the GPU and on the CPU from the same weights: the
// same loss and parameter gradients to within bf16's noise.
TEST(MixedPrecisionGpu, GptStepUnderAutocastMatchesTheCpu) {
  DDP_REQUIRE_CUDA();
  const models::GptConfig config = models::gpt_config("gpt:layers=2,d=64,heads=4,ctx=32,vocab=97");
  std::vector<int64_t> ids(4 * 32);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * 31 + 5) % 97);
  const Tensor tokens = from_vector(ids, {4, 32});
  std::rotate(ids.begin(), ids.begin() + 1, ids.end());
  const Tensor targets = from_vector(ids, {128});
  const auto step = [&](const Device& device) {
    Generator gen(3);
    auto model = models::make_gpt(config, gen);
    model->to(device);
    Tensor loss;
    {
      AutocastGuard guard;
      const Tensor logits = model->forward(tokens.to(device));
      EXPECT_EQ(logits.dtype(), DType::bf16);
      loss = F::cross_entropy(F::reshape(logits, {128, 97}), targets.to(device));
    }
    backward(loss);
    std::vector<Tensor> grads;
    for (const Tensor& p : model->parameters()) grads.push_back(grad(p).cpu());
    return std::make_pair(loss.item<float>(), grads);
  };
  const auto [cpu_loss, cpu_grads] = step(Device::cpu());
  const auto [gpu_loss, gpu_grads] = step(kGpu);
  EXPECT_NEAR(gpu_loss, cpu_loss, 2e-3 * cpu_loss);
  for (size_t i = 0; i < cpu_grads.size(); ++i) {
    ASSERT_EQ(gpu_grads[i].dtype(), DType::f32);
    const auto a = cpu_grads[i].to_vector<float>(), b = gpu_grads[i].to_vector<float>();
    double diff = 0.0, norm = 0.0;
    for (size_t j = 0; j < a.size(); ++j) {
      diff += (a[j] - b[j]) * (a[j] - b[j]);
      norm += static_cast<double>(a[j]) * a[j];
    }
    EXPECT_LT(std::sqrt(diff), 0.03 * std::sqrt(norm) + 1e-7) << "parameter " << i;
  }
}

}  // namespace
}  // namespace ddp
