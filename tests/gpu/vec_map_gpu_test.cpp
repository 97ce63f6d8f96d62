// The elementwise CUDA kernels that run through map_elements (Note [vectorized
// elementwise] in runtime/ops/cuda/vec_map.h) against the CPU, at lengths that leave
// every size of tail after the vectors (n mod 8 from 0 to 7, one element, none of
// whole vectors) and on views that start 1 or 3 elements into their storage, where a
// vector access is not allowed and the kernel runs one element at a time. Each
// element is computed by the same function as before, so the values are the CPU's:
// exact where the CPU's maths is the device's, one bf16 rounding (or f32 ulps) where
// the device's tanhf may differ (the CPU's GELU avoids 1 + tanh's cancellation, the
// device's does not: an absolute 1e-6 floor), a rounding apart where the device
// fuses a multiply-add that the CPU (-ffp-contract=off) rounds twice. The row
// kernels (LayerNorm, the classifier) must give the same bits on views off a vector
// as on aligned copies: their cut depends on indices, not addresses (Note
// [vectorized rows]). tests/unit/vec_map_test.cpp replays the partitions on the CPU.
// Without a GPU every test skips and says why.
#include "runtime/ops/ops.h"
#include "runtime/ops/transformer_ops.h"
#include "runtime/tensor.h"
#include "tests/gpu/elementwise_compare.h"
#include "tests/gpu/require_gpu.h"

#include <gtest/gtest.h>

#include "runtime/fmt.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <vector>

// A namespace of its own: helpers named as in other files of the unity build (Note
// [unity test builds] in tests/CMakeLists.txt).
namespace ddp::vec_map_gpu_test {
namespace {

using gpu_test::kGpu;
constexpr double kBf16Rounding = 1.0 / 128;

using gpu_test::expect_close;
using gpu_test::expect_same_bytes;

// n elements of a fresh 1-D tensor starting `offset` elements into its storage, on
// the CPU and the same values on the GPU (the same offset there).
struct Pair {
  Tensor cpu, gpu;
};
Pair make(int64_t n, int64_t offset, DType dtype, uint64_t seed) {
  const Tensor whole = cast(randn({n + offset}, seed), dtype);
  return {whole.slice(offset, offset + n), whole.to(kGpu).slice(offset, offset + n)};
}

TEST(VecMapGpu, ElementwiseOpsMatchTheCpuAtEveryTailAndOffset) {
  DDP_REQUIRE_CUDA();
  for (const int64_t n : {1, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 4099, (1 << 20) + 5}) {
    for (const int64_t offset : {0, 1, 3}) {
      const std::string at = fmt::format("n {}, offset {}", n, offset);
      const Pair x16 = make(n, offset, DType::bf16, 1), g16 = make(n, offset, DType::bf16, 2);
      const Pair x32 = make(n, offset, DType::f32, 3), y32 = make(n, offset, DType::f32, 4);
      expect_close(gelu(x16.gpu), gelu(x16.cpu), kBf16Rounding, 1e-6, "gelu bf16, " + at);
      expect_close(gelu(x32.gpu), gelu(x32.cpu), 1e-6, 1e-6, "gelu f32, " + at);
      // The device's 1 - tanh^2 from a rounded tanh, times the incoming gradient: a
      // floor that scales with the largest |g|.
      double g_max = 0;
      for (const float g : cast(g16.cpu, DType::f32).to_vector<float>()) {
        g_max = std::max(g_max, std::fabs(static_cast<double>(g)));
      }
      expect_close(gelu_backward(g16.gpu, x16.gpu), gelu_backward(g16.cpu, x16.cpu), kBf16Rounding,
                   2e-6 * (1 + g_max), "gelu_backward bf16, " + at);
      // The residual add's mixed form: f32 + bf16 -> f32, vectors of 8.
      expect_close(add(x32.gpu, x16.gpu), add(x32.cpu, x16.cpu), 0, 0, "add f32 + bf16, " + at);
      // Only one array off a vector (f32 arrays need 32 bytes for vectors of 8).
      const Pair a32 = make(n, 0, DType::f32, 5), a16 = make(n, 0, DType::bf16, 6);
      expect_close(add(a32.gpu, x16.gpu), add(a32.cpu, x16.cpu), 0, 0,
                   "add, bf16 alone off, " + at);
      expect_close(add(x32.gpu, a16.gpu), add(x32.cpu, a16.cpu), 0, 0, "add, f32 alone off, " + at);
      expect_close(mul(x16.gpu, g16.gpu), mul(x16.cpu, g16.cpu), 0, 0, "mul bf16, " + at);
      expect_close(cast(x32.gpu, DType::bf16), cast(x32.cpu, DType::bf16), 0, 0,
                   "cast to bf16, " + at);
      expect_close(cast(x16.gpu, DType::f32), cast(x16.cpu, DType::f32), 0, 0,
                   "cast to f32, " + at);
      expect_close(relu(x32.gpu), relu(x32.cpu), 0, 0, "relu f32, " + at);
      expect_close(scale(x16.gpu, 0.375f), scale(x16.cpu, 0.375f), 0, 0, "scale bf16, " + at);
      // In place on views: axpy_ and fill_ write through the offset. The device fuses
      // y + alpha x into one rounding where the CPU rounds twice: a rounding of the
      // larger term apart.
      Tensor yg = y32.gpu, yc = y32.cpu.clone();
      axpy_(-1.5f, x32.gpu, yg);
      axpy_(-1.5f, x32.cpu, yc);
      const auto got = yg.cpu().to_vector<float>(), want = yc.to_vector<float>();
      const auto xs = x32.cpu.to_vector<float>(), ys = y32.cpu.to_vector<float>();
      for (size_t i = 0; i < got.size(); ++i) {
        const double bound = std::ldexp(1.0, -23) * (std::fabs(ys[i]) + 2 * std::fabs(1.5 * xs[i]));
        ASSERT_NEAR(got[i], want[i], bound) << "axpy f32, " << at << ": element " << i;
      }
      Tensor fg = x16.gpu;
      fill_(fg, 2.5);
      expect_close(fg, full({n}, 2.5f, {.dtype = DType::bf16}), 0, 0, "fill bf16, " + at);
    }
  }
}

// The view's neighbours are not written: a vector store stays inside [0, n).
TEST(VecMapGpu, AViewsNeighboursAreLeftAlone) {
  DDP_REQUIRE_CUDA();
  for (const int64_t offset : {0, 1, 8}) {
    for (const int64_t n : {7, 8, 9, 23}) {
      Tensor whole = full({offset + n + 9}, -3.0f, {.dtype = DType::bf16, .device = kGpu});
      Tensor view = whole.slice(offset, offset + n);
      fill_(view, 1.0);
      const auto v = cast(whole.cpu(), DType::f32).to_vector<float>();
      for (int64_t i = 0; i < static_cast<int64_t>(v.size()); ++i) {
        const bool inside = i >= offset && i < offset + n;
        ASSERT_EQ(v[static_cast<size_t>(i)], inside ? 1.0f : -3.0f)
            << "element " << i << " of a view [" << offset << ", " << offset + n << ")";
      }
    }
  }
}

// t's values in a tensor of t's shape that starts `offset` elements into a buffer of
// its own (a view whose vectors are off their 16-byte addresses for offset 1 or 3).
Tensor shifted(const Tensor& t, int64_t offset) {
  Tensor buffer = zeros({t.numel() + offset}, {.dtype = t.dtype(), .device = t.device()});
  Tensor view = buffer.slice(offset, offset + t.numel()).reshape(t.shape());
  copy_(view, t);
  return view;
}

// Note [vectorized rows]: the row kernels cut each row by its index, so a view off a
// vector (element by element) gives the bits an aligned tensor (whole vectors) gives.
// The classifier's float statistics make it the order-sensitive half (a cut that
// moved with the address would change its bits: 50257-column rows start at every
// position within a vector); LayerNorm's double sums of these rows round to the same
// float in almost any order, so its half checks the element-by-element path's values
// (unit.VecMap.RowsAreCutByIndex... checks its order on the CPU).
TEST(VecMapGpu, RowKernelsGiveTheSameBitsOnViewsOffAVector) {
  DDP_REQUIRE_CUDA();
  for (const Shape& shape : {Shape{64, 768}, Shape{7, 33}, Shape{5, 3}}) {
    const std::string at = shape_str(shape);
    const int64_t d = shape.back();
    const Tensor x = add(randn(shape, 11), full(shape, 3.0f)).to(kGpu);
    const Tensor y = cast(randn(shape, 12), DType::bf16).to(kGpu);
    const Tensor w = randn({d}, 13).to(kGpu), b = randn({d}, 14).to(kGpu);
    const Tensor g = cast(randn(shape, 15), DType::bf16).to(kGpu);
    const LayerNormResult aligned = layer_norm(x, w, b, 1e-5f, DType::bf16);
    const LayerNormResult off = layer_norm(shifted(x, 1), w, b, 1e-5f, DType::bf16);
    expect_same_bytes(off.out, aligned.out, "layer_norm out, " + at);
    expect_same_bytes(off.mean, aligned.mean, "layer_norm mean, " + at);
    expect_same_bytes(off.rstd, aligned.rstd, "layer_norm rstd, " + at);
    const LayerNormGrads ga = layer_norm_backward(g, x, aligned, w);
    const LayerNormGrads go = layer_norm_backward(shifted(g, 1), shifted(x, 3), aligned, w);
    expect_same_bytes(go.x, ga.x, "layer_norm_backward x, " + at);
    expect_same_bytes(go.weight, ga.weight, "layer_norm_backward weight, " + at);
    const AddLayerNormResult fa = add_layer_norm(x, y, w, b, 1e-5f, DType::bf16);
    const AddLayerNormResult fo = add_layer_norm(x, shifted(y, 1), w, b, 1e-5f, DType::bf16);
    expect_same_bytes(fo.sum, fa.sum, "add_layer_norm sum, " + at);
    expect_same_bytes(fo.norm.out, fa.norm.out, "add_layer_norm out, " + at);
    expect_same_bytes(fo.norm.rstd, fa.norm.rstd, "add_layer_norm rstd, " + at);
  }
  for (const auto& [rows, classes] : std::vector<std::array<int64_t, 2>>{{64, 50257}, {9, 13}}) {
    const std::string at = fmt::format("[{}, {}]", rows, classes);
    const Tensor logits = cast(randn({rows, classes}, 16), DType::bf16).to(kGpu);
    std::vector<int64_t> ids(static_cast<size_t>(rows));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * 7919) % classes);
    const Tensor labels = from_vector(ids, {rows}).to(kGpu);
    const CrossEntropyResult a = softmax_cross_entropy(logits, labels);
    const CrossEntropyResult o = softmax_cross_entropy(shifted(logits, 1), labels);
    expect_same_bytes(o.lse, a.lse, "cross-entropy lse, " + at);
    expect_same_bytes(o.loss, a.loss, "cross-entropy loss, " + at);
    const Tensor one = full({}, 1.0f, {.device = kGpu});
    expect_same_bytes(
        softmax_cross_entropy_backward_from_logits(shifted(logits, 3), a.lse, labels, one),
        softmax_cross_entropy_backward_from_logits(logits, a.lse, labels, one),
        "cross-entropy backward, " + at);
  }
}

}  // namespace
}  // namespace ddp::vec_map_gpu_test
