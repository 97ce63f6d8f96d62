// The transformer ops on cuda:0 against the same ops on the CPU (whose own tests
// check them against finite differences and double references), on the same random
// inputs, forward and backward, at small odd shapes and gpt-mini's (B=4, T=256,
// C=384, 6 heads, MLP width 1536) and a GPT-2 vocabulary (50257). Copies (embedding)
// must match bit for bit, sums within a stated tolerance (nvcc contracts
// multiply-adds into FMAs; cuBLAS adds in its own order). The reductions that must be
// deterministic (embedding_backward, LayerNorm's weight and bias gradients,
// sum_squares) are run twice and compared bit for bit. Without a GPU every test
// skips and says why.
#include "runtime/autograd/autograd.h"
#include "runtime/autograd/functions.h"
#include "runtime/device.h"
#include "runtime/ops/ops.h"
#include "runtime/ops/transformer_ops.h"
#include "runtime/tensor.h"
#include "tests/gpu/require_gpu.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

// A namespace of its own: helpers named as in other files of the unity build (Note
// [unity test builds] in tests/CMakeLists.txt).
namespace ddp::transformer_ops_gpu_test {
namespace {

namespace F = functional;

using gpu_test::kGpu;

// |actual - expected| <= rtol * (|expected| + max |expected|) + 1e-7 for every element
// (the floor: an all-zero expectation must not demand bit equality by accident).
void expect_close(const Tensor& actual, const Tensor& expected, double rtol) {
  ASSERT_EQ(actual.shape(), expected.shape());
  ASSERT_TRUE(actual.device().is_cuda()) << actual.device();
  const std::vector<float> a = actual.cpu().to_vector<float>(), e = expected.to_vector<float>();
  double scale = 0.0;
  for (float v : e) scale = std::max(scale, static_cast<double>(std::fabs(v)));
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_NEAR(a[i], e[i], rtol * (std::fabs(e[i]) + scale) + 1e-7)
        << "element " << i << " of " << a.size();
  }
}

// Bit for bit; both on any device.
void expect_same_bytes(const Tensor& actual, const Tensor& expected) {
  const Tensor a = actual.cpu(), e = expected.cpu();
  ASSERT_EQ(a.dtype(), e.dtype());
  ASSERT_EQ(a.shape(), e.shape());
  const auto* pa = static_cast<const unsigned char*>(a.data_ptr());
  const auto* pe = static_cast<const unsigned char*>(e.data_ptr());
  const size_t width = element_size(a.dtype());
  for (size_t i = 0; i < a.nbytes(); i += width) {
    ASSERT_EQ(std::memcmp(pa + i, pe + i, width), 0) << "element " << i / width << " differs";
  }
}

TEST(TransformerOpsGpu, GeluAndBackwardMatchCpu) {
  DDP_REQUIRE_CUDA();
  uint64_t seed = 1;
  for (const Shape& shape : {Shape{7}, Shape{3, 5, 11}, Shape{4, 256, 1536}}) {
    SCOPED_TRACE(shape_str(shape));
    // Spread beyond the tanh's saturation on both sides.
    const Tensor x = scale(randn(shape, ++seed), 3.0f), grad = randn(shape, ++seed);
    expect_close(gelu(x.to(kGpu)), gelu(x), 1e-6);
    // 1 - tanh^2 near saturation: an ulp of tanh (tanhf vs std::tanh, FMA contraction)
    // times x gelu's slope; 1e-5 of the largest value still catches a wrong formula.
    expect_close(gelu_backward(grad.to(kGpu), x.to(kGpu)), gelu_backward(grad, x), 1e-5);
  }
}

TEST(TransformerOpsGpu, LayerNormAndBackwardMatchCpuAndAreDeterministic) {
  DDP_REQUIRE_CUDA();
  uint64_t seed = 10;
  // gpt-mini's rows; a row wider than a block; rows of one; more rows than one chunk.
  for (const Shape& shape :
       {Shape{4, 256, 384}, Shape{3, 7, 33}, Shape{2, 5000}, Shape{9, 1}, Shape{1000, 65}}) {
    SCOPED_TRACE(shape_str(shape));
    const int64_t d = shape.back();
    // An offset mean: a one-pass E[x^2] - mean^2 would lose digits here.
    const Tensor x = add(randn(shape, ++seed), full(shape, 50.0f));
    const Tensor w = randn({d}, ++seed), b = randn({d}, ++seed), grad = randn(shape, ++seed);
    const LayerNormResult cpu = layer_norm(x, w, b);
    const LayerNormResult gpu = layer_norm(x.to(kGpu), w.to(kGpu), b.to(kGpu));
    expect_close(gpu.out, cpu.out, 1e-5);
    expect_close(gpu.mean, cpu.mean, 1e-6);
    expect_close(gpu.rstd, cpu.rstd, 1e-5);
    const LayerNormGrads gcpu = layer_norm_backward(grad, x, cpu, w);
    const LayerNormGrads ggpu = layer_norm_backward(grad.to(kGpu), x.to(kGpu), gpu, w.to(kGpu));
    expect_close(ggpu.x, gcpu.x, 1e-4);
    expect_close(ggpu.weight, gcpu.weight, 1e-5);
    expect_close(ggpu.bias, gcpu.bias, 1e-5);
    const LayerNormGrads again = layer_norm_backward(grad.to(kGpu), x.to(kGpu), gpu, w.to(kGpu));
    expect_same_bytes(again.weight, ggpu.weight);
    expect_same_bytes(again.bias, ggpu.bias);
    expect_same_bytes(again.x, ggpu.x);
  }
}

// Note [accumulating into a pending gradient]: on the GPU, x's gradient added into a
// waiting one in the same kernel has the bits of the gradient then an add there (no
// fused multiply-add), for an f32 and a bf16 incoming gradient, on a view off a
// 16-byte vector too (the element-by-element path), and matches the CPU.
TEST(TransformerOpsGpu, LayerNormBackwardAddsIntoAWaitingGradientAsTheAdd) {
  DDP_REQUIRE_CUDA();
  uint64_t seed = 60;
  for (const Shape& shape : {Shape{4, 64, 768}, Shape{3, 7, 33}, Shape{9, 1}}) {
    for (DType g_dtype : {DType::f32, DType::bf16}) {
      for (const int64_t offset : {0, 1}) {
        SCOPED_TRACE(shape_str(shape) + " grad " + std::string(dtype_name(g_dtype)) + " offset " +
                     std::to_string(offset));
        const int64_t d = shape.back();
        const Tensor x = add(randn(shape, ++seed), full(shape, 20.0f));
        const Tensor w = randn({d}, ++seed), b = randn({d}, ++seed);
        const Tensor g = cast(randn(shape, ++seed), g_dtype), waiting = randn(shape, ++seed);
        const Tensor gx = x.to(kGpu), gw = w.to(kGpu), gg = g.to(kGpu);
        const LayerNormResult r = layer_norm(gx, gw, b.to(kGpu));
        const LayerNormGrads plain = layer_norm_backward(gg, gx, r, gw);
        const Tensor want = add(waiting.to(kGpu), plain.x);
        // The waiting gradient `offset` floats into a bigger buffer: off a vector.
        int64_t n = 1;
        for (const int64_t e : shape) n *= e;
        const Tensor buffer = zeros({n + offset + 1}, {.device = kGpu});
        Tensor into = buffer.flat_view(offset, shape);
        copy_(into, waiting.to(kGpu));
        const LayerNormGrads got = layer_norm_backward(gg, gx, r, gw, into);
        EXPECT_EQ(got.x.data_ptr(), into.data_ptr());
        expect_same_bytes(got.x, want);
        expect_same_bytes(got.weight, plain.weight);
        const std::vector<float> all = buffer.cpu().to_vector<float>();
        if (offset > 0) {
          EXPECT_EQ(all.front(), 0.0f) << "the float before the view";
        }
        EXPECT_EQ(all.back(), 0.0f) << "the float after the view";
        const LayerNormResult cpu = layer_norm(x, w, b);
        expect_close(got.x, add(waiting, layer_norm_backward(g, x, cpu, w).x), 1e-4);
      }
    }
  }
}

// Note [residual layer norm]: on the GPU the fused kernel gives the bits of add then
// layer_norm there (the same device code), and matches the CPU's fused op, for an f32
// and a bf16 branch and an f32 and a bf16 output, at GPT-2's row (768) and odd shapes.
TEST(TransformerOpsGpu, AddLayerNormGivesTheBitsOfAddThenLayerNorm) {
  DDP_REQUIRE_CUDA();
  uint64_t seed = 20;
  for (const Shape& shape : {Shape{4, 64, 768}, Shape{3, 7, 33}, Shape{2, 5000}, Shape{9, 1}}) {
    for (DType y_dtype : {DType::f32, DType::bf16}) {
      for (DType out_dtype : {DType::f32, DType::bf16}) {
        SCOPED_TRACE(shape_str(shape) + " y " + std::string(dtype_name(y_dtype)) + " out " +
                     std::string(dtype_name(out_dtype)));
        const int64_t d = shape.back();
        const Tensor x = add(randn(shape, ++seed), full(shape, 20.0f));
        const Tensor y = cast(randn(shape, ++seed), y_dtype);
        const Tensor w = randn({d}, ++seed), b = randn({d}, ++seed);
        const Tensor gx = x.to(kGpu), gy = y.to(kGpu), gw = w.to(kGpu), gb = b.to(kGpu);
        const AddLayerNormResult fused = add_layer_norm(gx, gy, gw, gb, 1e-5f, out_dtype);
        const Tensor sum = add(gx, gy);
        const LayerNormResult apart = layer_norm(sum, gw, gb, 1e-5f, out_dtype);
        expect_same_bytes(fused.sum, sum);
        expect_same_bytes(fused.norm.out, apart.out);
        expect_same_bytes(fused.norm.mean, apart.mean);
        expect_same_bytes(fused.norm.rstd, apart.rstd);
        const AddLayerNormResult cpu = add_layer_norm(x, y, w, b, 1e-5f, out_dtype);
        expect_same_bytes(fused.sum, cpu.sum);  // one f32 add each
        expect_close(cast(fused.norm.out, DType::f32), cast(cpu.norm.out, DType::f32),
                     out_dtype == DType::f32 ? 1e-5 : 8e-3);
        expect_close(fused.norm.rstd, cpu.norm.rstd, 1e-5);
      }
    }
  }
}

// n indices below `vocab`, half of them from a few hot tokens (repeated hundreds of
// times, as common tokens are in text), the rest spread over the whole table.
Tensor token_indices(const Shape& shape, int64_t vocab, uint32_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int64_t> any(0, vocab - 1), hot(0, 7);
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = i % 2 == 0 ? hot(gen) * 13 % vocab : any(gen);
  return from_vector(v, shape);
}

TEST(TransformerOpsGpu, EmbeddingAndBackwardEqualCpuBitForBit) {
  DDP_REQUIRE_CUDA();
  struct Case {
    int64_t vocab, d;
    Shape indices;
  };
  // GPT-2's token table at gpt-mini's batch; position table; tiny; more positions
  // than rows (every row repeated).
  for (const Case& c : {Case{50257, 384, {4, 256}}, Case{256, 384, {4, 256}}, Case{3, 5, {7}},
                        Case{100, 16, {64, 256}}}) {
    SCOPED_TRACE(fmt::format("V={} d={} indices {}", c.vocab, c.d, shape_str(c.indices)));
    const Tensor weight = randn({c.vocab, c.d}, 30);
    const Tensor idx = token_indices(c.indices, c.vocab, 31);
    expect_same_bytes(embedding(weight.to(kGpu), idx.to(kGpu)), embedding(weight, idx));
    Shape grad_shape = c.indices;
    grad_shape.push_back(c.d);
    const Tensor grad = randn(grad_shape, 32);
    // Note [deterministic embedding backward]: the CPU's order of additions.
    const Tensor gpu = embedding_backward(grad.to(kGpu), idx.to(kGpu), c.vocab);
    expect_same_bytes(gpu, embedding_backward(grad, idx, c.vocab));
    expect_same_bytes(embedding_backward(grad.to(kGpu), idx.to(kGpu), c.vocab), gpu);
  }
}

TEST(TransformerOpsGpu, EmbeddingOutOfRangeIndexGivesNanRowAndNoGradient) {
  DDP_REQUIRE_CUDA();
  const Tensor weight = randn({10, 4}, 33);
  const Tensor idx = from_vector(std::vector<int64_t>{2, -1, 10, 2}, {4});
  const std::vector<float> out = embedding(weight.to(kGpu), idx.to(kGpu)).cpu().to_vector<float>();
  const std::vector<float> w = weight.to_vector<float>();
  for (int64_t j = 0; j < 4; ++j) {
    EXPECT_EQ(out[static_cast<size_t>(j)], w[static_cast<size_t>(2 * 4 + j)]);
    EXPECT_TRUE(std::isnan(out[static_cast<size_t>(4 + j)])) << "index -1";
    EXPECT_TRUE(std::isnan(out[static_cast<size_t>(8 + j)])) << "index 10 of a 10-row table";
  }
  const Tensor grad = randn({4, 4}, 34);
  const std::vector<float> g = grad.to_vector<float>();
  const std::vector<float> gw =
      embedding_backward(grad.to(kGpu), idx.to(kGpu), 10).cpu().to_vector<float>();
  for (int64_t v = 0; v < 10; ++v) {
    for (int64_t j = 0; j < 4; ++j) {
      const float expected =
          v == 2 ? g[static_cast<size_t>(j)] + g[static_cast<size_t>(12 + j)] : 0.0f;
      EXPECT_EQ(gw[static_cast<size_t>(v * 4 + j)], expected) << "row " << v << " column " << j;
    }
  }
}

TEST(TransformerOpsGpu, SoftmaxAndLogSoftmaxWithBackwardsMatchCpu) {
  DDP_REQUIRE_CUDA();
  uint64_t seed = 40;
  // A GPT-2 vocabulary row (wider than a block many times), attention rows, tiny rows.
  for (const Shape& shape : {Shape{64, 50257}, Shape{4, 6, 256, 256}, Shape{5, 1}, Shape{3, 7}}) {
    SCOPED_TRACE(shape_str(shape));
    const Tensor x = scale(randn(shape, ++seed), 4.0f), grad = randn(shape, ++seed);
    const Tensor y = softmax(x), log_y = log_softmax(x);
    const Tensor gy = softmax(x.to(kGpu)), glog_y = log_softmax(x.to(kGpu));
    expect_close(gy, y, 1e-5);
    expect_close(glog_y, log_y, 1e-5);
    expect_close(softmax_backward(grad.to(kGpu), gy), softmax_backward(grad, y), 1e-4);
    expect_close(log_softmax_backward(grad.to(kGpu), glog_y), log_softmax_backward(grad, log_y),
                 1e-4);
  }
}

TEST(TransformerOpsGpu, BmmMatchesCpuForEveryTranspose) {
  DDP_REQUIRE_CUDA();
  struct Case {
    int64_t batch, m, k, n;
  };
  uint64_t seed = 50;
  // gpt-mini's attention products (24 = B * H matrices of [256, 64] and [256, 256]).
  for (const Case& c :
       {Case{24, 256, 64, 256}, Case{24, 256, 256, 64}, Case{3, 5, 7, 2}, Case{1, 1, 1, 1}}) {
    for (int trans = 0; trans < 4; ++trans) {
      const bool ta = (trans & 1) != 0, tb = (trans & 2) != 0;
      SCOPED_TRACE(fmt::format("[{}, {}, {}] x [{}, {}, {}] trans_a {} trans_b {}", c.batch, c.m,
                               c.k, c.batch, c.k, c.n, ta, tb));
      const Tensor a = randn(ta ? Shape{c.batch, c.k, c.m} : Shape{c.batch, c.m, c.k}, ++seed);
      const Tensor b = randn(tb ? Shape{c.batch, c.n, c.k} : Shape{c.batch, c.k, c.n}, ++seed);
      const BmmOptions o{.trans_a = ta, .trans_b = tb, .alpha = 0.125f};
      expect_close(bmm(a.to(kGpu), b.to(kGpu), o), bmm(a, b, o), 1e-5);
    }
  }
}

TEST(TransformerOpsGpu, CausalSoftmaxMatchesCpuWithExactZeros) {
  DDP_REQUIRE_CUDA();
  uint64_t seed = 60;
  for (const Shape& shape : {Shape{4, 6, 256, 256}, Shape{2, 3, 7, 7}, Shape{1, 1}}) {
    SCOPED_TRACE(shape_str(shape));
    const Tensor x = scale(randn(shape, ++seed), 3.0f);
    const Tensor cpu = causal_softmax(x), gpu = causal_softmax(x.to(kGpu));
    expect_close(gpu, cpu, 1e-5);
    const std::vector<float> g = gpu.cpu().to_vector<float>();
    const int64_t t = shape.back();
    for (size_t i = 0; i < g.size(); ++i) {
      const int64_t row = static_cast<int64_t>(i) / t % t, col = static_cast<int64_t>(i) % t;
      if (col > row) {
        ASSERT_EQ(g[i], 0.0f) << "row " << row << " column " << col;
      }
    }
  }
}

// Note [packed attention]: part p of `parts` side by side along the last dim of
// [B, T, parts * C] (qkv: 3 parts q, k, v; y: 1) as [B, H, T, D].
Tensor unpack_head_major(const std::vector<float>& packed, int64_t b, int64_t t, int64_t h,
                         int64_t d, int parts, int part) {
  const int64_t c = h * d;
  std::vector<float> out(static_cast<size_t>(b * h * t * d));
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t hi = 0; hi < h; ++hi)
      for (int64_t ti = 0; ti < t; ++ti)
        for (int64_t e = 0; e < d; ++e)
          out[static_cast<size_t>(((bi * h + hi) * t + ti) * d + e)] =
              packed[static_cast<size_t>((bi * t + ti) * parts * c + part * c + hi * d + e)];
  return from_vector(out, {b, h, t, d});
}

// The inverse: [B, H, T, D] tensors side by side into [B, T, parts.size() * C].
Tensor pack_token_major(const std::vector<Tensor>& parts, int64_t b, int64_t t, int64_t h,
                        int64_t d) {
  const int64_t c = h * d, width = static_cast<int64_t>(parts.size()) * c;
  std::vector<float> out(static_cast<size_t>(b * t * width));
  for (size_t p = 0; p < parts.size(); ++p) {
    const std::vector<float> v = parts[p].to_vector<float>();
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t hi = 0; hi < h; ++hi)
        for (int64_t ti = 0; ti < t; ++ti)
          for (int64_t e = 0; e < d; ++e)
            out[static_cast<size_t>((bi * t + ti) * width + static_cast<int64_t>(p) * c + hi * d +
                                    e)] = v[static_cast<size_t>(((bi * h + hi) * t + ti) * d + e)];
  }
  return from_vector(out, {b, t, width});
}

TEST(TransformerOpsGpu, PackedAttentionMatchesCpuForwardAndBackward) {
  DDP_REQUIRE_CUDA();
  struct Case {
    int64_t b, t, c, heads;
  };
  uint64_t seed = 70;
  // gpt-mini; small odd sizes; one position; one head.
  for (const Case& k :
       {Case{4, 256, 384, 6}, Case{2, 5, 12, 3}, Case{3, 1, 8, 2}, Case{1, 33, 64, 1}}) {
    SCOPED_TRACE(fmt::format("B={} T={} C={} heads={}", k.b, k.t, k.c, k.heads));
    const int64_t d = k.c / k.heads;
    const Tensor qkv = randn({k.b, k.t, 3 * k.c}, ++seed);
    const Tensor grad_y = randn({k.b, k.t, k.c}, ++seed);
    // The reference: functional::causal_attention on [B, H, T, D] copies, autograd.
    const std::vector<float> packed = qkv.to_vector<float>();
    std::vector<Tensor> in;
    for (int part = 0; part < 3; ++part) {
      in.push_back(unpack_head_major(packed, k.b, k.t, k.heads, d, 3, part));
      set_requires_grad(in.back(), true);
    }
    const Tensor ref = F::causal_attention(in[0], in[1], in[2]);
    backward(ref, unpack_head_major(grad_y.to_vector<float>(), k.b, k.t, k.heads, d, 1, 0));

    const AttentionResult gpu = causal_self_attention(qkv.to(kGpu), k.heads);
    expect_close(gpu.y, pack_token_major({ref}, k.b, k.t, k.heads, d), 1e-5);
    const Shape heads_shape{k.b * k.heads, k.t, d};
    const Tensor scores =
        bmm(unpack_head_major(packed, k.b, k.t, k.heads, d, 3, 0).reshape(heads_shape),
            unpack_head_major(packed, k.b, k.t, k.heads, d, 3, 1).reshape(heads_shape),
            {.trans_b = true, .alpha = 1.0f / std::sqrt(static_cast<float>(d))});
    expect_close(gpu.probs, causal_softmax(scores).reshape({k.b, k.heads, k.t, k.t}), 1e-5);

    const Tensor grad_qkv =
        causal_self_attention_backward(grad_y.to(kGpu), qkv.to(kGpu), gpu.probs, k.heads);
    const Tensor expected =
        pack_token_major({grad(in[0]), grad(in[1]), grad(in[2])}, k.b, k.t, k.heads, d);
    expect_close(grad_qkv, expected, 1e-4);

    // And the CPU's packed kernels (ops/cpu/attention.cpp), which read qkv the same way.
    const AttentionResult cpu = causal_self_attention(qkv, k.heads);
    expect_close(gpu.y, cpu.y, 1e-5);
    expect_close(gpu.probs, cpu.probs, 1e-5);
    expect_close(grad_qkv, causal_self_attention_backward(grad_y, qkv, cpu.probs, k.heads), 1e-4);
  }
}

TEST(TransformerOpsGpu, SumSquaresMatchesAFloat64SumAndIsDeterministic) {
  DDP_REQUIRE_CUDA();
  uint64_t seed = 80;
  // One element; one block; many blocks; more than the partial cap (1024 blocks).
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{300001}, int64_t{10'000'003}}) {
    SCOPED_TRACE(n);
    const Tensor x = randn({n}, ++seed);
    double ref = 0.0;
    for (float v : x.to_vector<float>()) ref += static_cast<double>(v) * v;
    const Tensor gpu = sum_squares(x.to(kGpu));
    ASSERT_EQ(gpu.dim(), 0);
    EXPECT_NEAR(gpu.cpu().to_vector<float>()[0], ref, 1e-6 * ref);
    expect_same_bytes(sum_squares(x.to(kGpu)), gpu);
    expect_close(gpu, sum_squares(x), 1e-6);
  }
}

}  // namespace
}  // namespace ddp::transformer_ops_gpu_test
