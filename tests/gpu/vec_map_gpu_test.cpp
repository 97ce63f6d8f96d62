// The elementwise CUDA kernels that run through map_elements (Note [vectorized
// elementwise] in runtime/ops/cuda/vec_map.h) against the CPU, at lengths that leave
// every size of tail after the vectors (n mod 8 from 0 to 7, one element, none of
// whole vectors) and on views that start 1 or 3 elements into their storage, where a
// vector access is not allowed and the kernel runs one element at a time. Each
// element is computed by the same function as before, so the values are the CPU's:
// exact where the CPU's maths is the device's, one bf16 rounding (or f32 ulps) where
// the device's tanhf may differ. tests/unit/vec_map_test.cpp replays the partition on
// the CPU. Without a GPU every test skips and says why.
#include "runtime/ops/ops.h"
#include "runtime/ops/transformer_ops.h"
#include "tests/gpu/require_gpu.h"

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>
#include <string>
#include <vector>

namespace ddp {
namespace {

const Device kGpu = Device::cuda(0);
constexpr double kBf16Rounding = 1.0 / 128;

// |a - e| <= rtol * |e| elementwise (rtol 0: the same value), a on the GPU.
void expect_close(const Tensor& actual, const Tensor& expected, double rtol,
                  const std::string& what) {
  ASSERT_TRUE(actual.device().is_cuda()) << what;
  ASSERT_EQ(actual.dtype(), expected.dtype()) << what;
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  const auto a = cast(actual.cpu(), DType::f32).to_vector<float>();
  const auto e = cast(expected, DType::f32).to_vector<float>();
  for (size_t i = 0; i < a.size(); ++i) {
    if (rtol == 0) {
      ASSERT_EQ(a[i], e[i]) << what << ": element " << i << " of " << a.size();
    } else {
      ASSERT_NEAR(a[i], e[i], rtol * std::fabs(e[i]) + 1e-30)
          << what << ": element " << i << " of " << a.size();
    }
  }
}

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
      expect_close(gelu(x16.gpu), gelu(x16.cpu), kBf16Rounding, "gelu bf16, " + at);
      expect_close(gelu(x32.gpu), gelu(x32.cpu), 1e-6, "gelu f32, " + at);
      expect_close(gelu_backward(g16.gpu, x16.gpu), gelu_backward(g16.cpu, x16.cpu), kBf16Rounding,
                   "gelu_backward bf16, " + at);
      // The residual add's mixed form: f32 + bf16 -> f32, vectors of 8.
      expect_close(add(x32.gpu, x16.gpu), add(x32.cpu, x16.cpu), 0, "add f32 + bf16, " + at);
      expect_close(mul(x16.gpu, g16.gpu), mul(x16.cpu, g16.cpu), 0, "mul bf16, " + at);
      expect_close(cast(x32.gpu, DType::bf16), cast(x32.cpu, DType::bf16), 0,
                   "cast to bf16, " + at);
      expect_close(cast(x16.gpu, DType::f32), cast(x16.cpu, DType::f32), 0, "cast to f32, " + at);
      expect_close(relu(x32.gpu), relu(x32.cpu), 0, "relu f32, " + at);
      expect_close(scale(x16.gpu, 0.375f), scale(x16.cpu, 0.375f), 0, "scale bf16, " + at);
      // In place on views: axpy_ and fill_ write through the offset.
      Tensor yg = y32.gpu, yc = y32.cpu.clone();
      axpy_(-1.5f, x32.gpu, yg);
      axpy_(-1.5f, x32.cpu, yc);
      expect_close(yg, yc, 1e-7, "axpy f32, " + at);
      Tensor fg = x16.gpu;
      fill_(fg, 2.5);
      expect_close(fg, full({n}, 2.5f, {.dtype = DType::bf16}), 0, "fill bf16, " + at);
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

}  // namespace
}  // namespace ddp
